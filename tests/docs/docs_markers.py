"""The docs test's markers in README.md and docs/*.md, and reading them.

Markers are HTML comments, invisible where the markdown is rendered:

``<!-- docs-test: run NAME [OPTION=VALUE ...] -->`` right before a fenced block: the docs test runs it.
    A ``bash`` block runs as one bash script (``set -e``) from the root of a copy of the repository,
    ``./dev`` included; a ``console`` block runs its ``$ `` lines; a ``python`` block runs as a script.
    Options: ``timeout=SECONDS``; ``background`` (still running when the next block starts; stopped at
    the end); ``ready=PATH`` (wait until the file exists); ``port=N`` (the literal N in this block and the
    document's later ones is replaced by one free port, so a documented ``--server.port 8000`` does not
    collide on a test machine).
``<!-- docs-test: skip REASON -->`` right before a fenced shell block that is not run, and why.
``<!-- docs-test: NAME.KEY TOLERANCE -->NUMBER`` a number the docs quote: ``KEY`` measured from run
    ``NAME``'s output. TOLERANCE: ``±X`` (absolute), ``±X%`` (relative), ``range`` (the text after the
    comment is ``A–B``, ``A-B`` or ``A to B``: the measured value lies in it), ``≤×F`` (at most F
    times the number), ``measured`` (a figure of the machine it was measured on, such as CPU seconds,
    which differ between CPU models of one machine kind by more than 2x: the run must report it, > 0, and
    the test sets no bound on it; the docs say where it was measured).

Every fenced ``bash``/``sh``/``shell``/``console`` block of these files carries ``run`` or ``skip``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHELL = ("bash", "sh", "shell", "console")
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->", re.S)
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
NUMBER = r"[-+]?\d+(?:\.\d+)?"
QUOTED_TEXT = {
    "range": re.compile(rf"\s*({NUMBER})\s*(?:–|-|to)\s*({NUMBER})"),
    "value": re.compile(rf"\s*({NUMBER})"),
}


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    text: str
    action: str | None = None  #: "run" or "skip" (None: unmarked)
    name: str = ""
    options: dict[str, str] = field(default_factory=dict)
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    def commands(self) -> str:
        """The script to run: a console block's ``$ `` lines (with their continuations), else the block."""
        if self.lang != "console":
            return self.text
        out: list[str] = []
        continuing = False
        for line in self.text.splitlines():
            if line.startswith("$ ") or continuing:
                out.append(line[2:] if line.startswith("$ ") else line)
                continuing = line.rstrip().endswith("\\")
        return "\n".join(out) + "\n"


@dataclass
class Quoted:
    doc: str
    line: int
    run: str
    key: str
    tolerance: str
    low: float
    high: float  #: == low for a single number

    @property
    def id(self) -> str:
        return f"{self.run}.{self.key}"

    def accepts(self, measured: float) -> bool:
        t = self.tolerance
        if t == "measured":
            return measured > 0
        if t == "range":
            return self.low <= measured <= self.high
        if t.startswith("≤×"):
            return measured <= self.low * float(t[2:])
        if t.endswith("%"):
            return abs(measured - self.low) <= abs(self.low) * float(t[1:-1]) / 100
        return abs(measured - self.low) <= float(t[1:])


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def read(path: Path) -> tuple[list[Block], list[Quoted]]:
    """The fenced blocks (with the marker right before each, if any) and the quoted numbers of one file."""
    text = path.read_text(encoding="utf-8")
    doc = str(path.relative_to(REPO))
    blocks: list[Block] = []
    for fence in FENCE.finditer(text):
        block = Block(doc, _line(text, fence.start()), fence.group(1), fence.group(2))
        before = text[:fence.start()].rstrip()
        marker = ([None] + list(MARKER.finditer(before, max(0, len(before) - 400))))[-1]
        if marker and marker.end() == len(before):
            words = marker.group(1).split()
            if words[0] == "run":
                block.action, block.name = "run", words[1]
                block.options = dict(w.split("=", 1) if "=" in w else (w, "") for w in words[2:])
            elif words[0] == "skip":
                block.action, block.reason = "skip", " ".join(words[1:])
        blocks.append(block)
    quoted: list[Quoted] = []
    for marker in MARKER.finditer(text):
        words = marker.group(1).split()
        if len(words) != 2 or "." not in words[0]:
            continue
        run, key = words[0].split(".", 1)
        tolerance = words[1]
        match = QUOTED_TEXT["range" if tolerance == "range" else "value"].match(text, marker.end())
        if match is None:
            raise ValueError(f"{doc}:{_line(text, marker.start())}: no number after the marker {marker.group(0)}")
        low = float(match.group(1))
        high = float(match.group(2)) if tolerance == "range" else low
        quoted.append(Quoted(doc, _line(text, marker.start()), run, key, tolerance, low, high))
    return blocks, quoted


def everything() -> tuple[list[Block], list[Quoted]]:
    blocks: list[Block] = []
    quoted: list[Quoted] = []
    for path in documents():
        b, q = read(path)
        blocks += b
        quoted += q
    return blocks, quoted
