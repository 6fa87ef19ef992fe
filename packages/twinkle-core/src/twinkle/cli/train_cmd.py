"""``twinkle train [CONFIG] [--group.field value ...]``: run the Trainer from a YAML/TOML file.

With no CONFIG it trains the embedded default job (tiny Qwen-style model, embedded tokenizer,
self-cognition data, LoRA, CPU, well under a minute). Ctrl-C stops after a complete checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any

#: The embedded default job: what ``twinkle train`` with no config runs.
DEFAULT_JOB: dict[str, Any] = {
    "total_epoch": 2,
    "global_batch_size": 8,
    "work_dir": "output/twinkle-train",
    "dataset": {"train_samples": 128, "eval_samples": 16},
    "eval_interval": 8,
    "checkpoint_interval": 8,
    "checkpoint_maxkeep": 2,
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train", help="train with the Trainer from a YAML/TOML config (no config: the embedded tiny default)",
        description=__doc__, epilog=options_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help=".yaml/.yml/.toml trainer config (default: the embedded job)")
    parser.set_defaults(func=run, accepts_overrides=True)


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """``--a.b value``, ``--a.b=value``, ``--flag`` (true) and ``--no-flag`` (false) as dotted keys."""
    from twinkle.trainer import ConfigError

    overrides: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise ConfigError(f"unexpected argument {token!r}; options are written --group.field value.")
        key, eq, value = token[2:].partition("=")
        key = key.replace("-", "_")
        if not eq:
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                value, i = tokens[i + 1], i + 1
            elif key.startswith("no_") or ".no_" in key:
                head, _, tail = key.rpartition("no_")
                key, value = head + tail, "false"
            else:
                value = "true"
        overrides[key] = value
        i += 1
    return overrides


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    from twinkle.trainer import ConfigError, TrainerConfig
    from twinkle.trainer.config import apply_overrides, load_config_file

    try:
        overrides = parse_overrides(list(extra or []))
        data = load_config_file(args.config) if args.config else dict(DEFAULT_JOB)
        config = TrainerConfig.from_dict(apply_overrides(data, overrides))
    except ConfigError as exc:
        print(f"twinkle train: error: {exc}", file=sys.stderr)
        return 2
    return _train(config)


def _train(config: Any) -> int:
    import warnings

    from twinkle.trainer import ConfigError, Trainer

    # The tiny default ties lm_head to the embeddings; these notes are expected there, not actionable.
    warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
    warnings.filterwarnings("ignore", message=".*save_embedding_layers.*")
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    try:
        trainer = Trainer(config)
    except ConfigError as exc:
        print(f"twinkle train: error: {exc}", file=sys.stderr)
        return 2
    bar = _progress(trainer, config.progress_bar)
    try:
        result = trainer.fit()
    finally:
        if bar is not None:
            bar.close()
    if trainer.is_main:
        loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
        state = "interrupted" if result.interrupted else "finished"
        print(f"twinkle train: {state} at step {result.step}/{result.total_step} in {result.seconds:.1f}s; "
              f"final loss {loss}; checkpoint: {result.checkpoint}")
        if result.best_eval_loss is not None:
            print(f"twinkle train: best eval loss {result.best_eval_loss:.4f}: {trainer.work_dir / 'best-checkpoint'}")
    return 130 if result.interrupted else 0


def _progress(trainer: Any, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    state: dict[str, Any] = {}

    def on_step(step: int, total: int, record: dict[str, float]) -> None:
        bar = state.get("bar")
        if bar is None:
            bar = state["bar"] = tqdm(total=total, initial=step - 1, desc="train", dynamic_ncols=True)
        bar.update(step - bar.n)
        bar.set_postfix(loss=f"{record.get('loss', float('nan')):.3f}", lr=f"{record.get('lr', 0.0):.2e}",
                        tok_s=f"{record.get('tokens_per_second', 0.0):.0f}")

    trainer.on_step = on_step

    class _Closer:
        def close(self) -> None:
            if "bar" in state:
                state["bar"].close()

    return _Closer()


def options_help(config_cls: type | None = None) -> str:
    """Every field of a dataclass config (default: TrainerConfig) as ``--group.field  (default: ...)`` lines."""
    from twinkle.trainer import TrainerConfig

    config_cls = config_cls or TrainerConfig
    lines = ["options (--field value, --group.field value; --flag / --no-flag for booleans):"]

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{f.name}.")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            lines.append(f"  --{prefix}{f.name.replace('_', '-')}  (default: {default!r})")

    walk(config_cls, "")
    return "\n".join(lines)
