"""``./dev``: hatch prepares the environment, then the command replaces the script, so its exit status is ours.

A fake ``hatch`` (``HATCH=``) and a fake environment stand in for the real ones: what is tested is
the script's plumbing (which binary runs, with which arguments, and what status comes back).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, Path]:
    envs = tmp_path / "envs"
    log = tmp_path / "calls.log"
    for name in ("default", "test"):
        (envs / name / "bin").mkdir(parents=True)
    # `hatch run ENV:python -c ""` syncs the environment; `hatch env find ENV` prints its directory
    hatch = _script(tmp_path / "hatch", f'echo "hatch $*" >> {log}\n'
                    f'if [ "$1 $2" = "env find" ]; then echo {envs}/$3; fi\n')
    _script(envs / "default" / "bin" / "twinkle", f'echo "twinkle $*" >> {log}\n'
            'case "$2" in --interrupt) exit 130 ;; --sigint) kill -INT $$ ;; esac\nexit 0\n')
    _script(envs / "test" / "bin" / "python", f'echo "python $*" >> {log}\n'
            'if [ "$1" = "-m" ]; then exit 5; fi\nexit 0\n')
    _script(envs / "default" / "bin" / "python", f'echo "default python $*" >> {log}\nexit 3\n')
    return {"hatch": hatch, "log": log}


def _dev(fake: dict[str, Path], *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HATCH": str(fake["hatch"])}
    # a shell's background job (nohup ... &) starts with SIGINT ignored, and children inherit that:
    # give ./dev the default disposition a terminal's Ctrl-C meets
    return subprocess.run([str(REPO / "dev"), *args], env=env, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_train_runs_the_environment_binary_and_passes_its_status(fake):
    assert _dev(fake, "train", "--total-step", "3").returncode == 0
    calls = fake["log"].read_text().splitlines()
    assert calls == ["hatch run default:python -c ", "hatch env find default", "twinkle train --total-step 3"]
    assert _dev(fake, "train", "--interrupt").returncode == 130  # twinkle train's status after Ctrl-C


def test_a_signal_is_not_turned_into_another_code(fake):
    assert _dev(fake, "train", "--sigint").returncode == -signal.SIGINT


def test_test_runs_pytest_with_the_arguments_and_returns_its_code(fake, monkeypatch):
    monkeypatch.delenv("TWINKLE_TEST_WORKERS", raising=False)
    assert _dev(fake, "test", "-q", "tests/cli").returncode == 5
    calls = fake["log"].read_text().splitlines()
    assert calls[-3:] == ["python scripts/ensure_test_models.py", "python scripts/ensure_cookbook_env.py",
                          "python -m pytest -n 2 --dist loadfile -q tests/cli"]
    monkeypatch.setenv("TWINKLE_TEST_WORKERS", "0")  # one process: no xdist options at all
    assert _dev(fake, "test", "-q", "tests/cli").returncode == 5
    assert fake["log"].read_text().splitlines()[-1] == "python -m pytest -q tests/cli"


def test_run_runs_a_script_in_the_default_environment(fake):
    assert _dev(fake, "run", "cookbook/rl/grpo.py", "--steps", "2").returncode == 3  # the script's own status
    calls = fake["log"].read_text().splitlines()
    assert calls == ["hatch run default:python -c ", "hatch env find default",
                     "default python cookbook/rl/grpo.py --steps 2"]
    assert _dev(fake, "run", "-m", "torch.distributed.run", "--nproc_per_node", "2", "x.py").returncode == 3
    assert fake["log"].read_text().splitlines()[-1] == "default python -m torch.distributed.run --nproc_per_node 2 x.py"
    missing = _dev(fake, "run")
    assert missing.returncode == 2 and missing.stderr.startswith("usage: ./dev run FILE.py")


def test_dev_env_bin_runs_from_that_environment_without_hatch(fake):
    env_bin = fake["hatch"].parent / "envs" / "default" / "bin"
    proc = subprocess.run([str(REPO / "dev"), "run", "x.py"], env={**os.environ, "HATCH": str(fake["hatch"]),
                          "DEV_ENV_BIN": str(env_bin)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert fake["log"].read_text().splitlines() == ["default python x.py"]  # no hatch call at all


def test_help_lists_every_command():
    proc = subprocess.run([str(REPO / "dev"), "help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for command in ("train", "run FILE.py", "run -m MODULE", "test", "lint", "hatch"):
        assert f"./dev {command}" in proc.stdout
