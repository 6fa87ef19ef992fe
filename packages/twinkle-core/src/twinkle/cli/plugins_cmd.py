"""``twinkle plugins``: every registered component, grouped by kind, with its providing package.

Without ``--kind`` the listing is a summary that fits :data:`WIDTH` columns: one heading per kind,
then per providing package its names, wrapped. ``--kind KIND`` shows that kind as a table with each
component's import target and status; ``--json`` gives everything, machine-readable.
"""

from __future__ import annotations

import argparse
import json
import textwrap

from twinkle.registry import KINDS, get_registry

#: Columns the summary listing fits in.
WIDTH = 100
#: Listed first in each kind.
CORE = "twinkle-core"


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plugins", help="list installed plugins and the components they register, by kind")
    parser.add_argument("--kind", choices=list(KINDS), help="only this kind, as a table with each import target")
    parser.add_argument("--json", action="store_true", help="machine-readable output (every field of every row)")
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


def table(rows: list[dict[str, str]]) -> list[str]:
    """One kind's rows as aligned columns (``--kind``)."""
    columns = ["kind", "name", "distribution", "version", "target", "status"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) if rows else len(c) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(row[c].ljust(widths[c]) for c in columns).rstrip() for row in rows]
    return lines


def summary(rows: list[dict[str, str]], width: int = WIDTH) -> list[str]:
    """Every kind with its count, then per providing package the names it registers, wrapped at ``width``."""
    by_kind: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        shown = row["name"] if row["status"] == "ok" else f"{row['name']} ({row['status']})"
        by_kind.setdefault(row["kind"], {}).setdefault(f"{row['distribution']} {row['version']}", []).append(shown)
    lines: list[str] = []
    column = max((len(p) for providers in by_kind.values() for p in providers), default=0) + 4
    for kind in KINDS:
        if kind not in by_kind:
            continue
        providers = by_kind[kind]
        lines.append(f"{kind} ({sum(map(len, providers.values()))})")
        for provider, names in sorted(providers.items(), key=_core_first):
            wrapped = textwrap.wrap(", ".join(names), width - column, break_on_hyphens=False) or [""]
            lines.append(f"  {provider:<{column - 2}}{wrapped[0]}")
            lines += [" " * column + line for line in wrapped[1:]]
    return lines


def _core_first(item: tuple[str, list[str]]) -> tuple[bool, str]:
    return not item[0].startswith(CORE + " "), item[0]


def run(args: argparse.Namespace) -> int:
    registry = get_registry()
    rows = _rows(args.kind)
    failed = dict(registry.plugin_manager.failed)
    if args.json:
        print(json.dumps({"components": rows, "failed_plugins": failed}, indent=2))
        return 0
    print("\n".join(table(rows) if args.kind else summary(rows)))
    plugins = sorted(registry.plugin_manager.provenance.values(), key=lambda p: p.plugin_name)
    kinds = len({r["kind"] for r in rows})
    footer = (f"{len(rows)} components of {kinds} kind{'s' if kinds != 1 else ''} from {len(plugins)} plugins: "
              + ", ".join(f"{p.plugin_name} ({p.distribution} {p.version})" for p in plugins) + ".")
    print("\n" + "\n".join(textwrap.wrap(footer, WIDTH)))
    if not args.kind:
        print("Filter by kind (with each import target): twinkle plugins --kind KIND; all fields as JSON: --json.")
    for name, error in failed.items():
        print(f"plugin {name!r} FAILED to load: {error}")
    return 0
