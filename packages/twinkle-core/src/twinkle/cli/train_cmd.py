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
    """``twinkle train`` in ``twinkle --help``; its arguments are parsed by :func:`run` (the config layer)."""
    sub.add_parser("train", help="train with the Trainer from a YAML/TOML config (no config: the embedded tiny "
                                 "default)", add_help=False)


def help_text() -> str:
    """``twinkle train --help``: every TrainerConfig option with the default this command uses."""
    from twinkle.config import from_mapping, render_help, schema_of
    from twinkle.trainer import TrainerConfig

    schema = schema_of(TrainerConfig)
    return render_help(schema, "usage: twinkle train [CONFIG] [--GROUP.NAME VALUE | --NAME VALUE ...] [--debug]", [
        (__doc__ or "").replace("``", "").strip(), "",
        "  CONFIG   a .yaml/.yml/.toml trainer config (default: the embedded job)",
        "  --debug  the Trainer's debug mode (see below), and the traceback of an error",
        "",
        "default: what `twinkle train` with no config file uses; config file: what a config file that",
        "leaves the field out gets.",
    ], shown=from_mapping(schema, DEFAULT_JOB).fields, note="config file")


def parse(tokens: list[str], job: dict[str, Any] = DEFAULT_JOB) -> Any:
    """The TrainerConfig of ``[CONFIG] [--group.field value ...]``: CONFIG (else ``job``), then the options.

    A total_step or total_epoch given on the command line replaces the other one of the file or job.
    """
    from twinkle.config import build, from_argv, from_mapping, load_file, schema_of
    from twinkle.trainer import TrainerConfig

    schema = schema_of(TrainerConfig)
    options = from_argv(schema, tokens, positional_config=True)
    base = from_mapping(schema, load_file(options.config), options.config) if options.config else (
        from_mapping(schema, job))
    for given, other in (("total_step", "total_epoch"), ("total_epoch", "total_step")):
        if options.fields.get(("", given)) is not None and ("", other) not in options.fields:
            options.fields[("", other)] = None
    return build(TrainerConfig, [base, options])


def run(tokens: list[str]) -> int:
    """Parse, check, train; an error is one ``twinkle train: error:`` message naming the option (``--debug``:
    the traceback instead)."""
    from twinkle.cli.errors import describe
    from twinkle.config import ConfigError
    from twinkle.hub import HubError

    debug = "--debug" in tokens  # the Trainer's debug option; here also: show the traceback of an error
    if {"-h", "--help"} & set(tokens):
        print(help_text(), end="")
        return 0
    config = None
    try:
        config = parse(tokens)
        return _train(config)
    except KeyboardInterrupt:
        print("twinkle train: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        print(f"twinkle train: error: {describe(exc, config)}\n(run with --debug for the traceback)", file=sys.stderr)
        return 2 if isinstance(exc, (ConfigError, HubError)) else 1


def _train(config: Any) -> int:
    from twinkle.trainer import Trainer

    trainer = Trainer(config)  # it builds the model through twinkle.launch, which silences the known warnings
    with progress(trainer, config.progress_bar):
        result = trainer.fit()
    if trainer.is_main:
        loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
        state = "interrupted" if result.interrupted else "finished"
        print(f"twinkle train: {state} at step {result.step}/{result.total_step} in {result.seconds:.1f}s; "
              f"final loss {loss}; checkpoint: {result.checkpoint}")
        if result.best_eval_loss is not None:
            print(f"twinkle train: best eval loss {result.best_eval_loss:.4f}: {trainer.work_dir / 'best-checkpoint'}")
        if config.exp_tracker == "jsonl":
            print(f"twinkle train: curves and a summary: twinkle plot {trainer.work_dir}")
    return 130 if result.interrupted else 0


@contextlib.contextmanager
def progress(trainer: Any, enabled: bool = True) -> Iterator[None]:
    """A training bar for ``trainer.fit()``; meanwhile log lines print above it and other libraries' bars
    stay quiet. ``twinkle train`` uses it; a script calling ``Trainer.fit()`` can too
    (``with progress(trainer): trainer.fit()``, see cookbook/transformers/full_sft.py).

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
