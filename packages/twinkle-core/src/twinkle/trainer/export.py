"""HF-format exports every ``hf_interval`` steps into ``work_dir/hf/step-N``, in the step loop or in the background."""

from __future__ import annotations

import functools
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from twinkle import collective
from twinkle.checkpoint import save_tokenizer, shared_atomic_directory
from twinkle.config import ConfigError
from twinkle.trainer.store import checkpoint_name, discard, list_checkpoints


class HFExports:
    """HF-format exports every ``hf_interval`` steps into ``work_dir/hf/step-N`` (LoRA merged on request).

    ``async_hf_export``: the weights are copied to host memory at the step (a merged export merges into a
    host copy of the model), then written by a background thread into a temporary directory that is renamed
    into place when complete; the step loop goes on meanwhile. One export is in flight at a time: the next
    export, or the end of fit(), waits for it. Rank 0 writes it (the weights of a data-parallel model are the same
    everywhere; a sharded model cannot export in the background).
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.root = trainer.work_dir / "hf"
        self.paths: list[str] = []
        self.pending: tuple[Future, Path, Path, int, int] | None = None
        self.pool: ThreadPoolExecutor | None = None
        if trainer.config.async_hf_export:
            backend = getattr(trainer.model, "backend", None)
            plan = getattr(backend, "dist_plan", None)
            if plan is not None and getattr(plan, "sharded", False):
                raise ConfigError("async_hf_export: a sharded (FSDP) model's export gathers from every rank and cannot "
                                  "run in the background; set async_hf_export=false.")

    def export(self, step: int, total: int) -> str:
        """Write (or, async, start) the export of ``step``; returns its final path."""
        trainer = self.trainer
        cfg, name = trainer.config, checkpoint_name(step)
        final = self.root / name
        if cfg.async_hf_export:
            self.finish()
            if collective.rank() == 0:
                self._start(final, step, total)
            self.paths.append(str(final))
            return str(final)
        if cfg.lora.enabled and cfg.lora.merge_on_export:
            merged = merged_model(trainer.model, trainer.adapter)  # every rank: a sharded model gathers
            with shared_atomic_directory(final) as tmp:
                if merged is not None:
                    _write_merged(merged, trainer.model, trainer.adapter, tmp)
        else:
            trainer.model.save(name, output_dir=str(self.root), adapter_name=trainer.adapter)
        self._done(final, step, total)
        return str(final)

    def _done(self, final: Path, step: int, total: int) -> None:
        trainer = self.trainer
        keep = trainer.config.hf_max_keep
        if keep is not None and keep > 0 and collective.rank() == 0:
            for _, path in list_checkpoints(self.root)[:-keep]:
                discard(path)
        if str(final) not in self.paths:
            self.paths.append(str(final))
        trainer._call("after_save_hf", step, total_step=total, checkpoint=final)

    def _start(self, final: Path, step: int, total: int) -> None:
        trainer = self.trainer
        model, adapter = trainer.model, trainer.adapter
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        if trainer.config.lora.enabled and trainer.config.lora.merge_on_export:
            snapshot = merged_model(model, adapter)
            write = functools.partial(_write_merged, snapshot, model, adapter, tmp)
        else:
            state = model.get_state_dict(adapter_name=adapter)
            snapshot = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
            write = functools.partial(_write_state, snapshot, model, adapter, tmp)
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="twinkle-hf-export")
        self.pending = (self.pool.submit(write), tmp, final, step, total)

    def finish(self) -> None:
        """Wait for the export in flight (if any), rename it into place, rotate, run after_save_hf (rank 0)."""
        if self.pending is None:
            return
        future, tmp, final, step, total = self.pending
        self.pending = None
        try:
            future.result()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():
            discard(final)
        os.replace(tmp, final)
        self._done(final, step, total)

    def close(self) -> None:
        self.finish()
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


def merged_model(model: Any, adapter: str) -> Any:
    """The model with ``adapter`` merged, on the host, from the model's own ``merged_model`` (every rank calls it;
    rank 0 gets the model, the others None)."""
    merge = getattr(model, "merged_model", None)
    if merge is None:
        raise ConfigError(f"lora.merge_on_export: {type(model).__name__} cannot merge its adapter into the exported "
                          "model; export the adapter instead (merge_on_export=false).")
    return merge(adapter)


def _write_merged(merged: Any, model: Any, adapter: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(directory))
    _save_tokenizer(model, adapter, directory)


def _write_state(state: dict[str, Any], model: Any, adapter: str | None, directory: Path) -> None:
    """An HF directory from a host copy of the weights: a flat PEFT adapter, or a save_pretrained model."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    peft_model = getattr(model.model, "module", model.model)
    if adapter is not None:
        save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "adapter_model.safetensors"),
                  metadata={"format": "pt"})
        peft_model.peft_config[adapter].save_pretrained(str(directory))
    else:
        hf = model.backend.hf_model() if hasattr(model.backend, "hf_model") else peft_model
        hf.save_pretrained(str(directory), state_dict=state)
    _save_tokenizer(model, adapter, directory)


def _save_tokenizer(model: Any, adapter: str | None, directory: Path) -> None:
    group = model.optimizer_group[adapter or next(iter(model.optimizer_group))]
    save_tokenizer(directory, group.template, getattr(model, "model_path", None))
