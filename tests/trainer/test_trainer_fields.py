"""The Trainer fields a user of xtuner's Trainer (seed 004) reaches for: do_clip, log_dir, tokenizer_path,
snapshot_interval, gradient_checkpointing, strategy, strict_load and the parallel sizes; each checked
against an independent reference run or file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from trainer_testing import assert_bitwise_equal, load_weights, tiny_job

from twinkle.hub import resolve_path
from twinkle.trainer import ConfigError, Trainer, store


def _tokenizer_copy(directory: Path) -> Path:
    """The embedded tokenizer with a recognisable chat template (a Jinja comment added)."""
    shutil.copytree(resolve_path("twinkle://tiny-qwen"), directory)
    (directory / "model.safetensors").unlink()
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = "{#- tokenizer_path test -#}" + config["chat_template"]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_fields_change_what_they_should_and_nothing_else(tmp_path: Path) -> None:
    """One run with every option on, against a plain run: the same weights where the option must not change
    the training (do_clip=False vs a norm that never clips; gradient checkpointing), the files where it must."""
    tokenizer = _tokenizer_copy(tmp_path / "tok")
    options = tiny_job(tmp_path / "wd", total_step=4, checkpoint_interval=3, snapshot_interval=1,
                       log_dir=str(tmp_path / "logs"), tokenizer_path=str(tokenizer), do_clip=False,
                       optimizer={"max_grad_norm": 1e-6},  # would freeze training if it clipped
                       model={"gradient_checkpointing": True, "strategy": "native_fsdp"})
    trainer = Trainer(**options)
    trainer.fit()
    reference = Trainer(**tiny_job(tmp_path / "ref", total_step=4, checkpoint_interval=3,
                                   optimizer={"max_grad_norm": 1e9}))  # a norm that never clips
    reference.fit()
    wd, ref = tmp_path / "wd" / "checkpoints", tmp_path / "ref" / "checkpoints"
    assert_bitwise_equal(load_weights(wd / "step-00000004" / "model"), load_weights(ref / "step-00000004" / "model"))
    assert trainer.model.strategy == "native_fsdp" and trainer.model.backend.hf_model().is_activation_checkpointing

    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4] and all(r["grad_norm"] > 1e-3 for r in records)
    assert not (tmp_path / "wd" / "logs").exists()

    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(wd / "step-00000004" / "model")  # the checkpoint is self-contained
    assert saved.chat_template.startswith("{#- tokenizer_path test -#}")

    # snapshots: steps 1 and 2 (between the full checkpoints 3 and 4), the latest only, never rotated
    assert sorted(p.name for p in wd.iterdir()) == ["snapshot", "step-00000003", "step-00000004"]
    assert store.verify(wd / store.SNAPSHOT)["step"] == 2
    # a restart from the snapshot (the full ones gone) continues exactly
    for name in ("step-00000003", "step-00000004"):
        shutil.rmtree(wd / name)
    resumed = Trainer(**{**options, "auto_resume": True})
    result = resumed.fit()
    assert result.resumed_from == str(wd / store.SNAPSHOT)
    assert f"auto_resume: resumed from {wd / store.SNAPSHOT} (step 2" in (tmp_path / "logs" / "train.log").read_text()
    assert_bitwise_equal(load_weights(wd / "step-00000004" / "model"), load_weights(ref / "step-00000004" / "model"))


def test_do_clip_true_clips(tmp_path: Path) -> None:
    clipped = Trainer(**tiny_job(tmp_path / "c", total_step=2, optimizer={"max_grad_norm": 1e-6}))
    clipped.fit()
    free = Trainer(**tiny_job(tmp_path / "f", total_step=2, do_clip=False, optimizer={"max_grad_norm": 1e-6}))
    free.fit()
    a = load_weights(tmp_path / "c" / "checkpoints" / "step-00000002" / "model")
    b = load_weights(tmp_path / "f" / "checkpoints" / "step-00000002" / "model")
    assert any(not (a[k] == b[k]).all() for k in a)


def test_strict_load_refuses_weights_that_do_not_fit_and_leaves_no_work_dir(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    shutil.copytree(resolve_path("twinkle://tiny-qwen"), partial)
    state = load_file(str(partial / "model.safetensors"))
    del state["model.layers.1.mlp.down_proj.weight"]
    save_file(state, str(partial / "model.safetensors"), metadata={"format": "pt"})

    strict = Trainer(**tiny_job(tmp_path / "strict", total_step=1, load_from=str(partial)))
    with pytest.raises(ValueError, match=r"1 missing .*model.layers.1.mlp.down_proj.weight.*strict_load=False"):
        strict.fit()
    assert not (tmp_path / "strict").exists()  # the failed start removed the work dir it had made
    lenient = Trainer(**tiny_job(tmp_path / "lenient", total_step=1, load_from=str(partial), strict_load=False))
    assert lenient.fit().step == 1


@pytest.mark.parametrize(("options", "words"), [
    ({"infra": {"fsdp_size": 2}}, r"infra: DeviceMesh: world size 1 is not divisible by fsdp\*tp\*pp\*cp=2"),
    ({"infra": {"sp_size": 2, "cp_size": 4}}, r"infra.cp_size: also set as infra.sp_size \(2 there, 4 here\); set "
                                              r"infra.cp_size once"),
    ({"model": {"type": "NoSuchModel"}}, r"model.type: .*NoSuchModel"),
    ({"dataset": {"template": "NoSuchTemplate"}}, r"dataset.template: .*NoSuchTemplate"),
    ({"loss": {"name": "NoSuchLoss"}}, r"loss.name: .*NoSuchLoss"),
    ({"seed": -1}, r"seed: invalid value -1; expected int >= 0"),
])
def test_bad_sizes_and_names_are_refused_before_anything_is_made(tmp_path: Path, options: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Trainer(**tiny_job(tmp_path / "wd", total_step=1, **options))
    assert not (tmp_path / "wd").exists()


def test_sp_size_is_the_context_parallel_size() -> None:
    from twinkle.launch import device_mesh
    from twinkle.trainer import TrainerConfig

    cfg = TrainerConfig.from_dict({"total_step": 1, "infra": {"mode": "ray", "dp_size": 2, "sp_size": 2,
                                                               "tp_size": 2}})
    assert cfg.infra.cp_size == 2 and not hasattr(cfg.infra, "sp_size")  # one field, two spellings
    mesh = device_mesh(cfg.infra)
    assert (mesh.dp_size, mesh.cp_size, mesh.tp_size, mesh.world_size) == (2, 2, 2, 8)


def test_the_documented_lines_load_the_main_jobs_checkpoint_and_generate(tmp_path: Path) -> None:
    """The snippet of docs/trainer.md, run as written with the path this run printed (FitResult.checkpoint)."""
    import re

    from trainer_testing import REPO

    result = Trainer(**tiny_job(tmp_path / "wd", total_step=2)).fit()
    text = (REPO / "docs" / "trainer.md").read_text()
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "PeftModel.from_pretrained" in b)
    snippet, count = re.subn(r'printed = ".*?"', f"printed = {result.checkpoint!r}", snippet)
    assert count == 1  # the snippet starts from the path `twinkle train` prints
    scope: dict = {}
    exec(compile(snippet, "docs/trainer.md", "exec"), scope)
    assert scope["model"].peft_config["default"].r == 16 and len(scope["ids"]["input_ids"][0]) > 3
