"""``twinkle plot WORK_DIR``: a run's curves (loss and eval loss, lr, grad norm, tokens/s) as a PNG, and a
one-screen summary. Reads the jsonl tracker's ``metrics.jsonl`` (found through ``work_dir/run.json``, else
``work_dir/logs``); needs matplotlib (``pip install 'twinkle-core[plot]'``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinkle.errors import TwinkleError

#: (record key, panel, label) of every curve drawn
CURVES = (("loss", "loss", "train loss"), ("eval_loss", "loss", "eval loss"), ("lr", "lr", "lr"),
          ("grad_norm", "grad norm", "grad norm"), ("tokens_per_second", "tokens/s", "tokens/s"))
PANELS = ("loss", "lr", "grad norm", "tokens/s")


class PlotError(TwinkleError, ValueError):
    """Nothing to plot, or no matplotlib; the message says what to do."""


@dataclass
class Plot:
    """What ``twinkle plot`` drew: the PNG, the run, every series ``{key: (steps, values)}`` and the summary."""

    png: Path
    run_id: str
    runs: list[str]
    series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    summary: str = ""
    figure: Any = None


def metrics_file(work_dir: Path) -> Path:
    from twinkle.trainer.workdir import RUN_FILE, read_json

    record = read_json(work_dir / RUN_FILE) or {}
    for directory in ([Path(record["log_dir"])] if record.get("log_dir") else []) + [work_dir / "logs"]:
        if (directory / "metrics.jsonl").is_file():
            return directory / "metrics.jsonl"
    raise PlotError(f"{work_dir}: no metrics.jsonl (looked in {work_dir / 'logs'}); is it the work_dir of a "
                    "`twinkle train` run with exp_tracker jsonl?")


def plot(work_dir: str | Path, output: str | Path | None = None, run: str | None = None) -> Plot:
    """Draw ``run`` (default: the newest) of ``work_dir`` to ``output`` (default: next to metrics.jsonl)."""
    from twinkle.trainer.trackers import read_records

    work_dir = Path(work_dir).expanduser()
    path = metrics_file(work_dir)
    runs = read_records(path)
    if not runs:
        raise PlotError(f"{path} holds no step records yet.")
    run_id = run if run is not None else list(runs)[-1]
    if run_id not in runs:
        raise PlotError(f"run {run_id!r} is not in {path}; its runs: {', '.join(runs)}.")
    records = runs[run_id]
    series: dict[str, tuple[list[int], list[float]]] = {}
    for key, _, _ in CURVES:
        points = [(r["step"], float(r[key])) for r in records if isinstance(r.get(key), (int, float))]
        if points:
            series[key] = ([s for s, _ in points], [v for _, v in points])
    if "loss" not in series:
        raise PlotError(f"run {run_id} in {path} has no training loss recorded yet.")
    png = Path(output) if output is not None else path.with_name(f"metrics-{run_id or 'run'}.png")
    figure = _draw(series, run_id, png)
    return Plot(png, run_id, list(runs), series, _summary(series, run_id, list(runs), path, png), figure)


def _draw(series: dict[str, tuple[list[int], list[float]]], run_id: str, png: Path) -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotError("twinkle plot needs matplotlib: pip install 'twinkle-core[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(PANELS), 1, figsize=(8, 2.4 * len(PANELS)), sharex=True)
    panels = dict(zip(PANELS, axes))
    for key, panel, label in CURVES:
        if key in series:
            steps, values = series[key]
            panels[panel].plot(steps, values, marker="o" if key == "eval_loss" else None, markersize=3, label=label)
    for panel, axis in panels.items():
        axis.set_ylabel(panel)
        axis.grid(alpha=0.3)
        if axis.get_lines():
            axis.legend(loc="best", fontsize="small")
    axes[-1].set_xlabel("step")
    figure.suptitle(f"twinkle run {run_id}")
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=100)
    plt.close(figure)
    return figure


def _summary(series: dict[str, tuple[list[int], list[float]]], run_id: str, runs: list[str], path: Path,
             png: Path) -> str:
    steps, losses = series["loss"]
    lines = [f"run {run_id} ({len(runs)} run{'s' if len(runs) > 1 else ''} in {path})",
             f"  steps        {steps[0]}..{steps[-1]} ({len(steps)} recorded)",
             f"  train loss   first {losses[0]:.4f}  last {losses[-1]:.4f}  min {min(losses):.4f} "
             f"(step {steps[losses.index(min(losses))]})"]
    if "eval_loss" in series:
        e_steps, e_values = series["eval_loss"]
        best = min(e_values)
        lines.append(f"  eval loss    last {e_values[-1]:.4f}  best {best:.4f} (step {e_steps[e_values.index(best)]})")
    if "lr" in series:
        lrs = series["lr"][1]
        lines.append(f"  lr           first {lrs[0]:.3g}  max {max(lrs):.3g}  last {lrs[-1]:.3g}")
    if "grad_norm" in series:
        norms = [v for v in series["grad_norm"][1] if math.isfinite(v)]
        if norms:
            lines.append(f"  grad norm    min {min(norms):.4g}  median {sorted(norms)[len(norms) // 2]:.4g}  "
                         f"max {max(norms):.4g}")
    if "tokens_per_second" in series:
        rates = series["tokens_per_second"][1]
        lines.append(f"  tokens/s     mean {sum(rates) / len(rates):.1f}  last {rates[-1]:.1f}")
    lines.append(f"  curves       {png}")
    return "\n".join(lines)
