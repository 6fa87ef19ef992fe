"""``twinkle plugins``: every registered component with its kind, provider and version."""

from __future__ import annotations

import argparse
import json

from twinkle.registry import KINDS, get_registry


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plugins", help="list installed plugins and the components they register")
    parser.add_argument("--kind", choices=list(KINDS), help="only this kind of component")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def _rows(kind: str | None) -> list[dict[str, str]]:
    registry = get_registry()
    rows = [
        {"kind": c.kind, "name": c.name, "distribution": c.distribution, "version": c.version, "target": c.target,
         "status": "override" if c.override else "ok"}
        for c in registry.components(kind)
    ]
    for (k, name), owners in sorted(registry.conflicts(kind).items()):
        rows += [
            {"kind": k, "name": name, "distribution": c.distribution, "version": c.version, "target": c.target,
             "status": "CONFLICT"}
            for c in owners
        ]
    return rows


def run(args: argparse.Namespace) -> int:
    registry = get_registry()
    rows = _rows(args.kind)
    failed = dict(registry.plugin_manager.failed)
    if args.json:
        print(json.dumps({"components": rows, "failed_plugins": failed}, indent=2))
        return 0
    columns = ["kind", "name", "distribution", "version", "target", "status"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) if rows else len(c) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        print("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip())
    plugins = sorted(registry.plugin_manager.provenance.values(), key=lambda p: p.plugin_name)
    print(f"\n{len(rows)} components from {len(plugins)} plugins: "
          + ", ".join(f"{p.plugin_name} ({p.distribution} {p.version})" for p in plugins))
    for name, error in failed.items():
        print(f"plugin {name!r} FAILED to load: {error}")
    return 0
