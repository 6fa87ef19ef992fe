"""``twinkle train [CONFIG] [--group.field value ...]``: run the Trainer from a YAML/TOML file.

With no CONFIG it trains the embedded default job (tiny Qwen-style model, embedded tokenizer,
self-cognition data, LoRA, CPU, well under a minute). Ctrl-C stops after a complete checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
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
    from twinkle.cli.train_help import options_help

    parser = sub.add_parser(
        "train", help="train with the Trainer from a YAML/TOML config (no config: the embedded tiny default)",
        description=(__doc__ or "").replace("``", ""), epilog=options_help(DEFAULT_JOB),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help=".yaml/.yml/.toml trainer config (default: the embedded job)")
    parser.set_defaults(func=run, accepts_overrides=True)


def parse_overrides(tokens: list[str], config_cls: type | None = None) -> dict[str, Any]:
    """``--a.b value``, ``--a.b=value``, ``--flag`` (true) and ``--no-flag`` (false) as dotted keys.

    A name without a group is a top-level field, or the field of that name in the one group that
    has it (``--max-length`` is ``dataset.max_length``, ``--lr 1e-4`` is ``optimizer.lr``), among the
    fields of ``config_cls`` (default: TrainerConfig).
    """
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
        overrides[_full_name(key, value, config_cls)] = value
        i += 1
    return overrides


def _full_name(key: str, value: str, config_cls: type | None = None) -> str:
    """The dotted field a command-line name means (see :func:`parse_overrides`)."""
    from twinkle.cli.train_help import fields
    from twinkle.trainer import ConfigError

    if "." in key:
        return key
    names = [name for name, _ in fields(config_cls)]
    groups = {name.split(".")[0] for name in names if "." in name}
    if key in names or (key in groups and value.strip().startswith("{")):
        return key
    owners = [name for name in names if name.endswith(f".{key}")]
    if len(owners) == 1:
        return owners[0]
    if len(owners) > 1:
        raise ConfigError(f"--{key.replace('_', '-')} is ambiguous: write one of "
                          f"{', '.join('--' + o.replace('_', '-') for o in owners)}.")
    return key  # unknown: the config check names it with a suggestion


def merge(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``overrides`` applied; a later total_step or total_epoch replaces the other one."""
    from twinkle.trainer.config import apply_overrides

    merged = apply_overrides(data, overrides)
    for given, other in (("total_step", "total_epoch"), ("total_epoch", "total_step")):
        if given in overrides and other not in overrides and str(overrides[given]).lower() not in ("none", "null"):
            merged.pop(other, None)
    return merged


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    """Parse, check, train; an error is one ``twinkle train: error:`` block (``--debug``: the traceback)."""
    from twinkle.trainer import ConfigError, TrainerConfig
    from twinkle.trainer.config import load_config_file

    tokens = list(extra or [])
    debug = "--debug" in tokens
    tokens = [t for t in tokens if t != "--debug"]
    try:
        overrides = parse_overrides(tokens)
        data = load_config_file(args.config) if args.config else dict(DEFAULT_JOB)
        config = TrainerConfig.from_dict(merge(data, overrides))
        return _train(config)
    except KeyboardInterrupt:
        print("twinkle train: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        from twinkle.errors import TwinkleError

        what = str(exc) if isinstance(exc, TwinkleError) else f"{type(exc).__name__}: {exc}"
        print(f"twinkle train: error: {what}\n(run with --debug for the traceback)", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1


def _train(config: Any) -> int:
    import warnings

    from twinkle.trainer import Trainer

    # The tiny default ties lm_head to the embeddings; these notes are expected there, not actionable.
    warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
    warnings.filterwarnings("ignore", message=".*save_embedding_layers.*")
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
    trainer = Trainer(config)
    with _progress(trainer, config.progress_bar):
        result = trainer.fit()
    if trainer.is_main:
        loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
        state = "interrupted" if result.interrupted else "finished"
        print(f"twinkle train: {state} at step {result.step}/{result.total_step} in {result.seconds:.1f}s; "
              f"final loss {loss}; checkpoint: {result.checkpoint}")
        if result.best_eval_loss is not None:
            print(f"twinkle train: best eval loss {result.best_eval_loss:.4f}: {trainer.work_dir / 'best-checkpoint'}")
    return 130 if result.interrupted else 0


@contextlib.contextmanager
def _progress(trainer: Any, enabled: bool) -> Iterator[None]:
    """A training bar; meanwhile log lines print above it and other libraries' bars stay quiet.

    Without this, a log record or transformers' "Writing model shards" bar (a checkpoint or HF
    export being written) lands in the middle of the training bar's line.
    """
    if not enabled:
        yield
        return
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
    with _logs_above_the_bar(), _quiet_library_bars():
        try:
            yield
        finally:
            if "bar" in state:
                state["bar"].close()


@contextlib.contextmanager
def _logs_above_the_bar() -> Iterator[None]:
    """twinkle's console log records go through ``tqdm.write`` (same format, filters and level)."""
    import logging

    from tqdm import tqdm

    from twinkle.log import get_logger

    logger = get_logger()
    consoles = [h for h in logger.handlers if type(h).__name__ == "_StderrHandler"]

    class _AboveBar(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            tqdm.write(self.format(record), file=sys.stderr)

    swapped = []
    for console in consoles:
        above = _AboveBar(console.level)
        above.setFormatter(console.formatter)
        for log_filter in console.filters:
            above.addFilter(log_filter)
        logger.removeHandler(console)
        logger.addHandler(above)
        swapped.append((console, above))
    try:
        yield
    finally:
        for console, above in swapped:
            logger.removeHandler(above)
            logger.addHandler(console)


@contextlib.contextmanager
def _quiet_library_bars() -> Iterator[None]:
    """transformers' own bars (loading weights, writing shards) off while the training bar is shown."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # a backend without transformers
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
