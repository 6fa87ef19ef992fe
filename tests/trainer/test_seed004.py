"""Seed 004 (xtuner v1's Trainer) as written: every constructor keyword under its seed name and type, the
config classes under xtuner's names (one schema with ours), build_engine / build_lr_scheduler / from_config,
and the seed's own example shape, which must train exactly (losses bitwise) like the same job in our names."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from trainer_testing import REPO, assert_bitwise_equal, load_weights

from twinkle.trainer import (
    AdamWConfig,
    CELossConfig,
    ConfigError,
    DataloaderConfig,
    DatasetConfig,
    FSDPConfig,
    HooksConfig,
    InternalMetricsConfig,
    LoadCheckpointConfig,
    LRConfig,
    ModelConfig,
    ResumeConfig,
    TokenizeFnConfig,
    Trainer,
    TrainerConfig,
)

SEEDS = Path(os.environ.get("TWINKLE_SHARED", REPO.parent / "shared")) / "seeds"


def _hook(**kwargs: object) -> None:
    """A hook for the config tests (never called there)."""


def seed_values(tmp_path: Path) -> dict[str, object]:
    """One value of the seed's type for every keyword of seed 004's constructor (Path where it says str | Path)."""
    import torch

    return {
        "load_from": None, "model_cfg": ModelConfig(), "optim_cfg": AdamWConfig(lr=1e-4), "fsdp_cfg": FSDPConfig(),
        "dataset_cfg": [{"dataset": DatasetConfig(anno_path=Path("/data/a.jsonl"))}],
        "dataloader_cfg": DataloaderConfig(), "loss_cfg": CELossConfig(), "lr_cfg": LRConfig(lr_type="cosine"),
        "tokenizer_path": Path("/tok"), "global_batch_size": 8, "work_dir": tmp_path / "wd", "log_dir": tmp_path / "l",
        "sp_size": 1, "total_step": 3, "total_epoch": None, "resume_cfg": ResumeConfig(), "auto_resume": False,
        "load_checkpoint_cfg": LoadCheckpointConfig(), "strict_load": True, "checkpoint_interval": -1,
        "checkpoint_maxkeep": -1, "async_hf_export": False, "skip_checkpoint_validation": False,
        "patch_for_dcp_finish": False, "async_checkpoint": False, "snapshot_interval": None,
        "check_health_interval": None, "hf_interval": None, "hf_max_keep": None, "exp_tracker": "jsonl",
        "profile_step": [2], "profile_time": True, "profile_memory": False, "intra_layer_micro_batch": 1, "seed": 42,
        "debug": False, "backend": None, "debug_skip_save": False, "prober_list": [], "do_clip": True,
        "grad_norm_dtype": torch.float32, "hooks_config": HooksConfig(), "internal_metrics_cfg": None,
    }


def test_every_seed_keyword_is_accepted_with_its_seed_type(tmp_path: Path) -> None:
    values = seed_values(tmp_path)
    found = sorted(SEEDS.glob("004_*.txt"))
    if found:  # the seed's own signature, read at test time: every keyword in it is covered here
        signature = re.search(r"class xtuner\.v1\.train\.trainer\.Trainer\(\*, (.*?)\)\n", found[0].read_text())
        names = [part.split(":")[0].strip() for part in re.split(r", (?=[a-z_]+:)", signature.group(1))]
        assert sorted(names) == sorted([*values, "trainer_cfg"])
    trainer = Trainer(**values)
    cfg = trainer.config
    assert cfg.optimizer.lr == 1e-4 and cfg.optimizer.betas == [0.9, 0.95] and cfg.lr.lr_type == "cosine"
    assert cfg.dataset.sources()[0].dataset_id == "/data/a.jsonl" and cfg.tokenizer_path == "/tok"
    assert cfg.work_dir == str(tmp_path / "wd") and cfg.grad_norm_dtype == "float32" and cfg.profile_steps == [2]
    # trainer_cfg: a TrainerConfig, with keywords replacing its fields
    again = Trainer(trainer_cfg=cfg, total_step=5)
    assert again.config.total_step == 5 and again.config.optimizer == cfg.optimizer
    assert Trainer.from_config(cfg).config == cfg
    with pytest.raises(ConfigError, match=r"optimizer.lr: also set as optim_cfg.lr"):
        Trainer(**{**values, "optimizer": {"lr": 1.0}})


def test_xtuner_spellings_and_ours_are_one_schema(tmp_path: Path) -> None:
    """The same job in xtuner's names and ours: equal configs from Python, YAML and TOML; the same errors."""
    import torch

    ours = TrainerConfig(
        total_step=4, global_batch_size=4, work_dir=str(tmp_path), backend="gloo",
        optimizer={"lr": 1e-3, "weight_decay": 0.01, "betas": [0.9, 0.95], "eps": 1e-8},
        lr={"lr_type": "linear", "warmup_ratio": 0.5, "lr_min": 0.0}, infra={"cp_size": 1},
        model={"mixed_precision": "bf16", "gradient_checkpointing": True}, auto_resume=True,
        load_checkpoint={"load_scheduler": False}, dataset={"dataset_id": "twinkle://self-cognition"},
        grad_norm_dtype="float64", hooks={"after_fit": [_hook]}, internal_metrics={"internal_metrics_interval": 2})
    xtuner = TrainerConfig(
        total_step=4, global_batch_size=4, work_dir=tmp_path, dist_backend="gloo", optim_cfg=AdamWConfig(lr=1e-3),
        lr_cfg=LRConfig(lr_type="linear", warmup_ratio=0.5, lr_min=0.0), sp_size=1,
        fsdp_cfg=FSDPConfig(param_dtype="bfloat16", recompute_ratio=1.0),
        resume_cfg=ResumeConfig(auto_resume=True, load_scheduler=False),
        dataset_cfg=DatasetConfig(anno_path="twinkle://self-cognition"), grad_norm_dtype=torch.float64,
        hooks_config=HooksConfig(after_fit=_hook),
        internal_metrics_cfg=InternalMetricsConfig(internal_metrics_interval=2))
    assert _plain(xtuner) == _plain(ours)
    yaml_text = (f"total_step: 4\nglobal_batch_size: 4\nwork_dir: {tmp_path}\ndist_backend: gloo\nsp_size: 1\n"
                 "optim_cfg: {lr: 0.001, weight_decay: 0.01, betas: [0.9, 0.95], eps: 1.0e-8}\n"
                 "lr_cfg: {lr_type: linear, warmup_ratio: 0.5, lr_min: 0.0}\n"
                 "fsdp_cfg: {param_dtype: torch.bfloat16, recompute_ratio: 1.0}\n"
                 "resume_cfg: {auto_resume: true, load_scheduler: false}\n"
                 "dataset_cfg: {anno_path: twinkle://self-cognition}\ngrad_norm_dtype: torch.float64\n"
                 "hooks_config: {after_fit: 'test_seed004:_hook'}\n"
                 "internal_metrics_cfg: {internal_metrics_interval: 2}\n")
    (tmp_path / "x.yaml").write_text(yaml_text)
    (tmp_path / "x.toml").write_text(
        f'total_step = 4\nglobal_batch_size = 4\nwork_dir = "{tmp_path}"\ndist_backend = "gloo"\nsp_size = 1\n'
        'grad_norm_dtype = "float64"\n[optim_cfg]\nlr = 0.001\nweight_decay = 0.01\nbetas = [0.9, 0.95]\neps = 1e-8\n'
        '[lr_cfg]\nlr_type = "linear"\nwarmup_ratio = 0.5\nlr_min = 0.0\n[fsdp_cfg]\nparam_dtype = "bfloat16"\n'
        'recompute_ratio = 1.0\n[resume_cfg]\nauto_resume = true\nload_scheduler = false\n[dataset_cfg]\n'
        'anno_path = "twinkle://self-cognition"\n[hooks_config]\nafter_fit = "test_seed004:_hook"\n'
        '[internal_metrics_cfg]\ninternal_metrics_interval = 2\n')
    for path in ("x.yaml", "x.toml"):
        assert _plain(TrainerConfig.from_file(tmp_path / path)) == _plain(ours), path
    # one schema: a wrong value fails the same way in both spellings, naming the option as written
    with pytest.raises(ConfigError, match=r"optim_cfg.lr: invalid value -1"):
        TrainerConfig.from_dict({"total_step": 1, "optim_cfg": {"lr": -1}})
    with pytest.raises(ConfigError, match=r"optimizer.lr: invalid value -1"):
        TrainerConfig.from_dict({"total_step": 1, "optimizer": {"lr": -1}})
    with pytest.raises(ConfigError, match=r"grad_norm_dtype: invalid value torch.float16; expected {float32,float64}"):
        TrainerConfig(total_step=1, grad_norm_dtype=torch.float16)
    with pytest.raises(ConfigError, match=r"fsdp.tp_size: gives infra.tp_size = 2, but infra.tp_size is also set to 4"):
        TrainerConfig(total_step=1, fsdp_cfg=FSDPConfig(tp_size=2), infra={"tp_size": 4})


def _plain(cfg: TrainerConfig) -> dict:
    """The config as comparable data (hooks by name; the forwarding groups' own spelling dropped)."""
    data = cfg.to_dict()
    data["hooks"] = {k: [h.__name__ for h in v] if v else v for k, v in data["hooks"].items()}
    for name in ("fsdp", "resume"):
        data.pop(name)
    data["work_dir"] = str(data["work_dir"])
    return data


def _losses(work_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (work_dir / "logs" / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


def test_the_seed_example_shape_trains_exactly_like_our_names(tmp_path: Path) -> None:
    """xtuner's documented way (configs by keyword, fit()) on the embedded tiny model, against our spelling."""
    model_cfg = ModelConfig(model_id="twinkle://tiny-qwen")
    dataset_cfg = [{"dataset": DatasetConfig(name="self-cognition", anno_path="twinkle://self-cognition"),
                    "tokenize_fn": TokenizeFnConfig(max_length=128)}]
    dataloader_cfg = DataloaderConfig(gradient_accumulation_steps=2)
    optim_cfg = AdamWConfig(lr=1e-3)
    lr_cfg = LRConfig(lr_type="cosine", lr_min=1e-6)
    trainer = Trainer(model_cfg=model_cfg, optim_cfg=optim_cfg, dataset_cfg=dataset_cfg, dataloader_cfg=dataloader_cfg,
                      lr_cfg=lr_cfg, loss_cfg=CELossConfig(), fsdp_cfg=FSDPConfig(tp_size=1), global_batch_size=4,
                      total_step=4, work_dir=tmp_path / "xtuner", progress_bar=False)
    trainer.fit()
    ours = Trainer(total_step=4, global_batch_size=4, work_dir=str(tmp_path / "ours"), progress_bar=False,
                   dataset={"dataset_id": "twinkle://self-cognition", "max_length": 128},
                   dataloader={"gradient_accumulation_steps": 2},
                   optimizer={"lr": 1e-3, "weight_decay": 0.01, "kwargs": {"betas": (0.9, 0.95), "eps": 1e-8}},
                   lr={"scheduler": "CosineWarmupScheduler", "warmup_steps": 0,
                       "kwargs": {"min_lr_ratio": 1e-6 / 1e-3}})
    ours.fit()
    losses = _losses(tmp_path / "xtuner")
    assert len(losses) == 4 and losses == _losses(tmp_path / "ours")  # bitwise: the same floats
    final = "checkpoints/step-00000004/model"
    assert_bitwise_equal(load_weights(tmp_path / "xtuner" / final), load_weights(tmp_path / "ours" / final))

    # build_engine / build_lr_scheduler: public, with the seed's meaning (the engine is what fit() drives)
    from torch.optim.lr_scheduler import LRScheduler

    engine = trainer.build_engine(None, model_cfg, trainer.config.optimizer)
    assert hasattr(engine, "forward_backward") and engine.engine.backend is engine.backend
    trainer.model = engine
    scheduler = trainer.build_lr_scheduler(LRConfig(lr_type="linear", warmup_ratio=0.5, lr_min=0.0), 4)
    assert isinstance(scheduler, LRScheduler)
    lrs = []
    for _ in range(4):
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    # 2 warm-up steps from 0, then linear to lr_min; float64 Python arithmetic (a division and a product by lr,
    # each within 2**-53): < 1e-15 relative from these decimals, inside rel 1e-12; a step off moves an lr by half
    assert lrs == pytest.approx([0.0, 0.5e-3, 1e-3, 0.5e-3], rel=1e-12, abs=0)
