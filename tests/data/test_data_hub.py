"""twinkle.hub.resolve_path: local paths, embedded assets, hf:// through a real offline cache, ms:// errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from twinkle.assets import asset_path
from twinkle.hub import resolve_path


def test_local_paths_and_assets(tmp_path):
    (tmp_path / "blob").write_text("{}\n")
    (tmp_path / "a.jsonl").symlink_to(tmp_path / "blob")  # like a file in the HF cache: a link to a blob
    assert resolve_path(tmp_path / "a.jsonl") == str(tmp_path / "a.jsonl")
    assert resolve_path("twinkle://self-cognition").endswith("self_cognition.jsonl")
    tiny = Path(resolve_path("twinkle://tiny-qwen"))
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tiny.iterdir()}


@pytest.mark.parametrize(("value", "exc", "message"), [
    ("no/such/dir", FileNotFoundError, r"'no/such/dir': no such local file or directory .*; hub ids start with"),
    ("twinkle://weights", FileNotFoundError,
     r"no embedded asset 'weights'; known: self-cognition, tiny-internvl2.5, tiny-qwen, .*twinkle://<name>"),
    ("hf://", ValueError, r"not a valid hub id"),
    ("ms://a/b/c", ValueError, r"not a valid hub id"),
    (42, TypeError, r"Expected a path or a hub id string, got int"),
])
def test_bad_ids(value, exc, message):
    with pytest.raises(exc, match=message):
        resolve_path(value)


def test_modelscope_is_optional(monkeypatch):
    monkeypatch.setitem(sys.modules, "modelscope", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"pip install 'twinkle-core\[modelscope\]'"):
        resolve_path("ms://Qwen/Qwen3-0.6B")


def test_modelscope_download_is_called_with_the_repo(monkeypatch, tmp_path):
    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tmp_path)

    monkeypatch.setitem(sys.modules, "modelscope", types.SimpleNamespace(snapshot_download=snapshot_download))
    assert resolve_path("ms://swift/self-cognition", "dataset", revision="v1") == str(tmp_path)
    assert calls == [("swift/self-cognition", {"repo_type": "dataset", "revision": "v1"})]


def _fake_hf_cache(cache: Path, kind: str, repo: str, files: dict[str, Path | str]) -> Path:
    """The layout huggingface_hub writes: <kind>s--org--name/{refs/main, snapshots/<sha>/...}."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"{kind}s--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / sha
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(sha)
    for name, source in files.items():
        if isinstance(source, Path):
            shutil.copy(source, snapshot / name)
        else:
            (snapshot / name).write_text(source)
    return snapshot


def test_hf_ids_resolve_through_an_offline_cache(tmp_path):
    tiny = asset_path("tiny-qwen")
    model_snapshot = _fake_hf_cache(tmp_path, "model", "twinkle-test/tiny", {p.name: p for p in tiny.iterdir()})
    rows = "".join(json.dumps({"instruction": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(5))
    data_snapshot = _fake_hf_cache(tmp_path, "dataset", "twinkle-test/rows", {"train.jsonl": rows})
    code = (
        "import json\n"
        "from twinkle.hub import resolve_path\n"
        "from twinkle.dataset import Dataset, DatasetMeta\n"
        "ds = Dataset(DatasetMeta('hf://twinkle-test/rows', data_slice=range(3)))\n"
        "ds.set_template('Template', model_id='hf://twinkle-test/tiny')\n"
        "ds.map('AlpacaProcessor').encode()\n"
        "print(json.dumps({'model': resolve_path('hf://twinkle-test/tiny'),\n"
        "                  'data': resolve_path('hf://twinkle-test/rows', 'dataset'), 'rows': len(ds),\n"
        "                  'labels': ds[0]['labels']}))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["model"] == str(model_snapshot) and out["data"] == str(data_snapshot) and out["rows"] == 3
    assert any(label != -100 for label in out["labels"])
