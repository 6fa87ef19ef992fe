"""Ids that do not resolve (issue 26, item 5): the error says which option, which id, and what was tried.

Nothing here reaches the network: "offline" is huggingface_hub's own switch, "unreachable" a closed
port on this machine, and the hub's answers (no such repository, gated) are raised by a stand-in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from twinkle.cli.errors import describe, options_holding
from twinkle.hub import HubClientMissingError, HubError, IdNotFoundError, resolve_path


def test_a_missing_local_path_is_not_offered_as_a_hub_id(tmp_path):
    with pytest.raises(IdNotFoundError) as info:
        resolve_path("./no/such/dir")
    err = info.value
    assert err.id == "./no/such/dir" and isinstance(err, FileNotFoundError)
    assert "no such local file or directory" in err.reason and os.path.abspath("no/such/dir") in err.reason
    assert "ms://./no" not in str(err) and "hf://./no" not in str(err)


def test_an_org_name_that_is_not_a_directory_suggests_the_hub_prefixes():
    with pytest.raises(IdNotFoundError, match=r"write 'hf://Qwen/Qwen3-0.6B' \(Hugging Face\) or "
                                              r"'ms://Qwen/Qwen3-0.6B' \(ModelScope\)"):
        resolve_path("Qwen/Qwen3-0.6B")


def test_hf_offline_and_not_cached_says_so(monkeypatch, tmp_path):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(IdNotFoundError) as info:
        resolve_path("hf://nonexistent-org/no-such-model")
    assert info.value.id == "hf://nonexistent-org/no-such-model"
    assert info.value.reason.startswith(f"not in the Hugging Face cache ({tmp_path}) and downloads are off "
                                        "(HF_HUB_OFFLINE=1)")


def test_hf_unreachable_names_the_endpoint_and_the_connection_error(tmp_path):
    """A closed local port stands in for a machine without network (a fresh process reads HF_ENDPOINT)."""
    code = ("from twinkle.hub import resolve_path, IdNotFoundError\n"
            "try:\n    resolve_path('hf://nonexistent-org/no-such-model')\n"
            "except IdNotFoundError as exc:\n    print(exc.reason)\n")
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("the Hugging Face Hub (http://127.0.0.1:9) could not be reached (ConnectError: ")
    assert f"is not in the cache ({tmp_path})" in proc.stdout


@pytest.mark.parametrize(("error", "says"), [
    ("RepositoryNotFoundError", "no such model repository on the Hugging Face Hub"),
    ("GatedRepoError", "a gated model on the Hugging Face Hub: accept its terms"),
    ("RevisionNotFoundError", "has no revision 'v9'"),
])
def test_hf_answers_are_said_in_the_users_terms(monkeypatch, error, says):
    import huggingface_hub
    from huggingface_hub import errors

    cls = getattr(errors, error)

    def snapshot_download(**kwargs):
        raise cls.__new__(cls, "404 Client Error")  # its __init__ wants an HTTP response

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with pytest.raises(IdNotFoundError, match=says):
        resolve_path("hf://org/name", revision="v9")


def test_ms_without_the_client_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "modelscope", None)  # import fails as if not installed
    with pytest.raises(HubClientMissingError) as info:
        resolve_path("ms://nonexistent-org/no-such-model")
    assert isinstance(info.value, ImportError)
    assert info.value.reason == "the ModelScope client is not installed: pip install 'twinkle-core[modelscope]'"


def test_ms_download_failure_says_what_modelscope_said(monkeypatch):
    def snapshot_download(repo_id, **kwargs):
        raise ConnectionError("Max retries exceeded with url: /api/v1/models/org/name\nmore")

    monkeypatch.setitem(sys.modules, "modelscope", types.SimpleNamespace(snapshot_download=snapshot_download))
    with pytest.raises(IdNotFoundError, match=r"'ms://org/name': the model could not be downloaded from ModelScope "
                                              r"and is not in its cache \(ConnectionError: Max retries exceeded "
                                              r"with url: /api/v1/models/org/name\)"):
        resolve_path("ms://org/name")


def test_hub_errors_survive_pickling():
    import pickle

    err = pickle.loads(pickle.dumps(IdNotFoundError("hf://a/b", "gone")))
    assert (type(err), err.id, err.reason, str(err)) == (IdNotFoundError, "hf://a/b", "gone", "'hf://a/b': gone")


def test_the_error_names_every_option_holding_the_id():
    from twinkle.trainer import TrainerConfig

    config = TrainerConfig.from_dict({"total_step": 1, "model": {"model_id": "hf://a/b"}, "tokenizer_path": "hf://a/b",
                                      "dataset": {"dataset_id": "data.jsonl"}})
    assert sorted(options_holding(config, "hf://a/b")) == ["--model.model-id", "--tokenizer-path"]
    assert describe(IdNotFoundError("data.jsonl", "no such file"), config) == "--dataset.dataset-id 'data.jsonl': " \
                                                                             "no such file"
    assert describe(HubError("elsewhere", "gone"), config) == "'elsewhere': gone"  # no option holds it
    assert describe(ValueError("x"), config) == "ValueError: x"


@pytest.mark.parametrize(("model_id", "says"), [
    ("./no/such/dir", "no such local file or directory"),
    ("hf://nonexistent-org/no-such-model", "not in the Hugging Face cache"),
    ("ms://nonexistent-org/no-such-model", "pip install 'twinkle-core[modelscope]'"),
])
def test_twinkle_train_prints_one_error_naming_the_option(tmp_path, monkeypatch, capsys, model_id, says):
    import huggingface_hub.constants as constants

    from twinkle.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "modelscope", None)  # the same answer whether or not it is installed
    assert main(["train", "--model.model-id", model_id, "--total-step", "1", "--train-samples", "8",
                 "--no-progress-bar"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2].startswith(f"twinkle train: error: --model.model-id {model_id!r}: ") and says in err[-2]
    assert err[-1] == "(run with --debug for the traceback)"
    assert not any("error" in line.lower() for line in err[:-2])
