"""A missing optional dependency is one line naming the extra (issue 26, item 4), and ./dev's environment has
the extras a CPU needs."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from twinkle.extras import EXTRAS, MissingExtraError, hint, require

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def _extras_of(package: str) -> set[str]:
    project = tomllib.loads((REPO / "packages" / package / "pyproject.toml").read_text())["project"]
    return set(project.get("optional-dependencies", {}))


def test_every_named_extra_exists_and_dev_installs_the_cpu_ones():
    root = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["envs"]["default"]
    members = {m["path"] if isinstance(m, dict) else m: set(m.get("features", [])) if isinstance(m, dict) else set()
               for m in root["workspace"]["members"]}
    for module, extra in EXTRAS.items():
        package, _, feature = extra.install.partition("[")
        feature = feature.rstrip("]")
        if package.startswith("twinkle-") and feature:
            assert feature in _extras_of(package), (module, extra.install)
        if extra.in_dev:  # ./dev's environment: the package, with that extra
            assert f"packages/{package}" in members, (module, extra.install)
            assert not feature or feature in members[f"packages/{package}"], (module, extra.install)


def test_require_names_the_extra_in_one_line(monkeypatch):
    for name in [n for n in sys.modules if n == "PIL" or n.startswith("PIL.")] or ["PIL"]:
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if Pillow were not installed (even when
        # an earlier test in this process imported PIL.ImageDraw)
    with pytest.raises(MissingExtraError) as info:
        require("PIL.ImageDraw", "drawing the shapes data")
    text = str(info.value)
    assert text == ("drawing the shapes data needs Pillow, which is not installed: pip install "
                    "'twinkle-core[vision]' (./dev's environment has it)")
    assert isinstance(info.value, ImportError) and "\n" not in text
    again = pickle.loads(pickle.dumps(info.value))
    assert (type(again), str(again), again.name) == (MissingExtraError, text, "PIL.ImageDraw")


def test_a_dependency_missing_inside_an_installed_extra_is_not_renamed(monkeypatch):
    def fake_import(name):
        raise ModuleNotFoundError("No module named 'defusedxml'", name="defusedxml")

    monkeypatch.setattr("importlib.import_module", fake_import)
    with pytest.raises(ModuleNotFoundError) as info:
        require("PIL", "x")
    assert not isinstance(info.value, MissingExtraError)


def test_the_vl_data_says_which_extra_when_pillow_is_missing(monkeypatch):
    from twinkle.multimodal.shapes import shape_rows

    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.delitem(sys.modules, "PIL.Image", raising=False)
    monkeypatch.delitem(sys.modules, "PIL.ImageDraw", raising=False)
    with pytest.raises(MissingExtraError, match=r"pip install 'twinkle-core\[vision\]'"):
        shape_rows(2, seed=0)


def test_hint_for_a_bare_module_not_found():
    assert hint(ModuleNotFoundError("No module named 'ray'", name="ray")) == (
        "No module named 'ray': it comes with Ray: pip install 'twinkle-core[ray]'")
    assert hint(ModuleNotFoundError("No module named 'numpyy'", name="numpyy")) is None
    assert hint(ValueError("x")) is None


def test_twinkle_train_prints_the_extra_for_a_missing_module(monkeypatch, capsys):
    from twinkle.cli import train_cmd

    def train(config):
        raise ModuleNotFoundError("No module named 'ray'", name="ray")

    monkeypatch.setattr(train_cmd, "_train", train)
    assert train_cmd.run(["--total-step", "1"]) == 1
    assert capsys.readouterr().err.splitlines()[0] == ("twinkle train: error: No module named 'ray': it comes with "
                                                       "Ray: pip install 'twinkle-core[ray]'")
