"""Third-party plugins installed for real (pip --target) and seen through entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A directory holding the example and the broken plugin, installed by pip from tests/plugins/."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target",
         str(target), str(PLUGINS / "twinkle-example-plugin"), str(PLUGINS / "twinkle-broken-plugin")],
        check=True,
    )
    return target


def run_python(site: Path, code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]  # keep a source checkout's paths after it
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **env}
    return subprocess.run([sys.executable, *args, "-c", code] if code else [sys.executable, *args],
                          capture_output=True, text=True, env=environ, timeout=120)


RESOLVE = r"""
import json, warnings
warnings.simplefilter("always")
import torch
from twinkle.registry import KINDS, get_registry, resolve
from twinkle.model import TwinkleModel
from twinkle.model import ExampleModel                      # model by attribute, like TransformersModel
loss = resolve("loss", "ExampleL1Loss")()                   # loss by name string, like CrossEntropyLoss
value = loss({"target": torch.zeros(2)}, {"logits": torch.tensor([1.0, -3.0])})
opt = resolve("optimizer", "ExampleSGD")([torch.nn.Parameter(torch.ones(1))], lr=0.1)
names = {"model": "ExampleModel", "loss": "ExampleL1Loss", "metric": "ExampleMetric", "optimizer": "ExampleSGD",
         "lr_scheduler": "ExampleConstantLR", "template": "ExampleTemplate", "preprocessor": "ExamplePreprocessor",
         "processor": "ExampleProcessor", "patch": "ExamplePatch", "kernel": "example_rms_norm",
         "precision": "example_fp4", "platform": "example_device", "command": "example-hello"}
reg = get_registry()
print(json.dumps({
    "subclass": issubclass(ExampleModel, TwinkleModel),
    "loss": float(value),
    "opt": type(opt).__name__,
    "kinds": {k: reg.get(k, n).distribution + " " + reg.get(k, n).version for k, n in names.items()},
    "all_resolve": all(resolve(k, n) is not None for k, n in names.items()),
    "same_path_as_builtin": type(reg.get("loss", "CrossEntropyLoss")) is type(reg.get("loss", "ExampleL1Loss")),
    "failed": reg.plugin_manager.failed,
}))
"""


def test_example_plugin_components_resolve_like_builtin_ones(site):
    proc = run_python(site, RESOLVE)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["subclass"] is True
    assert out["loss"] == 2.0  # mean(|1|, |-3|): binary-exact float32 values and operations
    assert out["opt"] == "ExampleSGD"
    assert set(out["kinds"].values()) == {"twinkle-example-plugin 0.3.1"}
    assert len(out["kinds"]) == 13
    assert out["all_resolve"] and out["same_path_as_builtin"]
    # the broken plugin was skipped with exactly one warning naming it, and the others still loaded
    assert list(out["failed"]) == ["broken"]
    assert proc.stderr.count("TwinklePluginWarning") == 1
    assert "'broken'" in proc.stderr and "twinkle-broken-plugin 9.9.9" in proc.stderr
    assert "RuntimeError: twinkle_broken needs a library that is not installed" in proc.stderr


def test_twinkle_plugins_lists_every_component_with_its_distribution(site):
    proc = run_python(site, "", "-m", "twinkle.cli.main", "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    rows = {(r["kind"], r["name"]): r for r in listing["components"]}
    assert rows[("model", "ExampleModel")]["distribution"] == "twinkle-example-plugin"
    assert rows[("model", "ExampleModel")]["version"] == "0.3.1"
    assert rows[("optimizer", "AdamW")]["distribution"] == "twinkle-core"
    assert rows[("platform", "npu")]["distribution"] == "twinkle-npu"
    assert rows[("model", "MegatronModel")]["distribution"] == "twinkle-megatron"
    assert rows[("model", "TransformersModel")]["distribution"] == "twinkle-hf"
    assert rows[("patch", "ExamplePatch")]["distribution"] == "twinkle-example-plugin"  # a plugin's Patch subclass
    assert rows[("patch", "GradientCheckpointing")]["distribution"] == "twinkle-core"
    assert rows[("patch", "TransformersFusedCEPatch")]["distribution"] == "twinkle-hf"
    assert {r["kind"] for r in listing["components"]} >= {"model", "loss", "optimizer", "platform", "kernel"}
    assert "broken" in listing["failed_plugins"]

    table = run_python(site, "", "-m", "twinkle.cli.main", "plugins", "--kind", "model")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "DISTRIBUTION", "VERSION", "TARGET", "STATUS"]
    example = next(line for line in lines if "ExampleModel" in line).split()
    assert example == ["model", "ExampleModel", "twinkle-example-plugin", "0.3.1",
                       "twinkle_example.components:ExampleModel", "ok"]
    assert "plugin 'broken' FAILED to load" in table.stdout


def test_plugin_command_runs_as_a_twinkle_subcommand(site):
    """`twinkle NAME ...` runs a plugin's registered command with the arguments after NAME."""
    proc = run_python(site, "", "-m", "twinkle.cli.main", "example-hello", "--x", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "hello from twinkle-example-plugin: --x 1"
    failing = run_python(site, "", "-m", "twinkle.cli.main", "example-hello", "--fail")
    assert failing.returncode == 3
    listing = run_python(site, "", "-m", "twinkle.cli.main", "--help")
    assert "example-hello" in listing.stdout and "say hello (example plugin)" in listing.stdout
    unknown = run_python(site, "", "-m", "twinkle.cli.main", "no-such-command")
    assert unknown.returncode == 2
    assert "Unknown command 'no-such-command'" in unknown.stderr and "example-hello" in unknown.stderr


def test_disabling_a_plugin_by_name(site):
    proc = run_python(site, RESOLVE, TWINKLE_DISABLE_PLUGINS="broken")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["failed"] == {}
    assert "TwinklePluginWarning" not in proc.stderr
