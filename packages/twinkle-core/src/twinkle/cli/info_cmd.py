"""``twinkle info``: the detected platform and this process's place in the mesh."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("info", help="show the detected platform and the device placement")
    parser.add_argument("--device", help="force a platform (cpu, cuda, npu, ...)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import twinkle

    runtime = twinkle.initialize(device=args.device)
    print(twinkle.get_device_placement(runtime))
    return 0
