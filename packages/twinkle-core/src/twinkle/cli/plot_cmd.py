"""``twinkle plot WORK_DIR``: a ``twinkle train`` run's curves as a PNG and a one-screen summary."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plot", help="draw a twinkle train run's loss, eval loss, lr, grad norm and tokens/s "
                                         "to a PNG and print a summary (needs matplotlib: twinkle-core[plot])")
    parser.add_argument("work_dir", help="the run's work_dir")
    parser.add_argument("--output", "-o", help="PNG path (default: next to metrics.jsonl, metrics-RUN.png)")
    parser.add_argument("--run", help="which run of the work_dir (default: the newest)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from twinkle.trainer.plot import PlotError, plot

    try:
        drawn = plot(args.work_dir, args.output, args.run)
    except PlotError as exc:
        print(f"twinkle plot: error: {exc}", file=sys.stderr)
        return 2
    print(drawn.summary)
    return 0
