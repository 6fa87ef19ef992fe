"""What a newcomer types first: ``twinkle`` alone and ``twinkle plugins`` (issue 26, item 6)."""

from __future__ import annotations

from twinkle.cli.main import main
from twinkle.cli.plugins_cmd import WIDTH
from twinkle.registry import KINDS, get_registry


def test_twinkle_alone_prints_the_help_and_succeeds(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: twinkle")
    for command in ("plugins", "info", "train", "serve"):
        assert f"    {command} " in out


def test_plugins_groups_by_kind_within_the_width_and_says_how_to_filter(capsys):
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= WIDTH
    components = get_registry().components()
    kinds = [k for k in KINDS if any(c.kind == k for c in components)]
    headings = [line for line in lines if line and not line.startswith(" ") and line.endswith(")")]
    assert headings == [f"{k} ({sum(c.kind == k for c in components)})" for k in kinds]  # one heading per kind
    text = " ".join(lines)
    for component in components:
        assert component.name in text, component.name
    assert "twinkle plugins --kind KIND" in lines[-1]
    # the summary names each providing package once per kind, not once per component
    assert sum("twinkle-core" in line for line in lines) <= len(kinds) + 1


def test_plugins_for_one_kind_is_a_table_with_targets(capsys):
    assert main(["plugins", "--kind", "optimizer"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "DISTRIBUTION", "VERSION", "TARGET", "STATUS"]
    rows = {line.split()[1]: line.split() for line in lines[1:] if line.startswith("optimizer ")}
    assert rows["AdamW"] == ["optimizer", "AdamW", "twinkle-core", rows["AdamW"][3], "torch.optim:AdamW", "ok"]
