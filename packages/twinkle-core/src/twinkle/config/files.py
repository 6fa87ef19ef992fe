"""Reading a config file (YAML or TOML) into a mapping, bounded before anything is expanded.

A YAML anchor may be repeated by aliases, and an alias may stand inside the block it repeats: nine
levels of ``&a [*b, *b, ...]`` are a few hundred bytes that mean billions of values. PyYAML shares
the repeated objects, so loading is cheap, but anything that walks the result (a check, an error
message's ``repr``) would expand it. :func:`load_file` therefore counts the values the file means
(each shared object as often as it is used, without expanding it) and refuses a file past
:data:`MAX_VALUES` or nested deeper than :data:`MAX_DEPTH`, naming the file. A key given twice in one
YAML mapping is an error too (PyYAML would keep the last silently; TOML refuses it itself).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from twinkle.config.schema import ConfigError

#: values (scalars, lists, tables; every use of a shared one counted) a config file may mean
MAX_VALUES = 100_000
#: lists and tables inside one another, at most
MAX_DEPTH = 32
#: bytes a config file may have (configs are a few KB; data belongs in dataset files)
MAX_BYTES = 4 << 20


def load_file(path: str | Path) -> dict[str, Any]:
    """A ``.yaml``/``.yml`` (PyYAML, imported only here) or ``.toml`` file as a mapping (empty file: ``{}``).

    Args:
        path: the file.

    Returns:
        Its top-level mapping. A ConfigError names the file for an unreadable, malformed, oversized or
        over-nested file, an alias bomb, or a key repeated in one YAML mapping.
    """
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise file_error(path, "expected a .yaml, .yml or .toml file.")
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise file_error(path, f"it is {size} bytes, more than a config file's {MAX_BYTES}; keep data in "
                                   "dataset files and point dataset.dataset_id at them.")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise file_error(path, f"cannot read it ({exc.strerror or exc}).") from None
    except UnicodeDecodeError as exc:
        raise file_error(path, f"not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
    loads, parse_error, kind = _parser(suffix, path)
    try:
        data = loads(text)
    except RepeatedKey as exc:
        raise file_error(path, str(exc)) from None
    except parse_error as exc:
        raise file_error(path, f"not valid {kind}: {exc}.") from None
    except RecursionError:
        raise file_error(path, f"nested too deeply to read (at most {MAX_DEPTH} levels of lists and tables).") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise file_error(path, f"the top level must be a mapping of groups, got {type(data).__name__}.")
    check_bounds(data, path)
    return dict(data)


def check_bounds(data: Any, path: Path, children: Callable[[Any], list[Any] | None] | None = None) -> None:
    """Refuse ``data`` if it means more than MAX_VALUES values or nests deeper than MAX_DEPTH.

    Each container is measured once (by identity) and a shared one counted at every use, so the count is
    what a walk would meet, found in time proportional to the file, not to the expansion. ``children``
    gives a container's children (None: a scalar); by default lists, tuples and mappings are containers.
    """
    children = children or _data_children
    measured: dict[int, tuple[int, int]] = {}  # id -> (values it means, its depth)
    open_now: set[int] = set()  # containers being measured: meeting one again is a cycle

    def measure(value: Any, level: int) -> tuple[int, int]:
        items = children(value)
        if items is None:
            return 1, 0
        key = id(value)
        if key in measured:
            return measured[key]
        if key in open_now or level >= MAX_DEPTH:
            raise file_error(path, f"its lists and tables nest deeper than {MAX_DEPTH} levels (or an alias repeats "
                                   "a block inside itself); write the values out flat.")
        open_now.add(key)
        count, depth = 1, 0
        for child in items:
            n, d = measure(child, level + 1)
            count, depth = count + n, max(depth, d + 1)
            if count > MAX_VALUES:
                raise file_error(path, f"it means more than {MAX_VALUES} values once its YAML aliases (*name) are "
                                       "expanded (an anchor repeated inside repeated anchors); write the values out, "
                                       "without nested aliases.")
        open_now.discard(key)
        measured[key] = (count, depth)
        return count, depth

    measure(data, 0)


def _data_children(value: Any) -> list[Any] | None:
    if isinstance(value, Mapping):
        return [*value.keys(), *value.values()]
    return list(value) if isinstance(value, (list, tuple)) else None


def _node_children(node: Any) -> list[Any] | None:
    """A YAML node's children: a sequence's items, a mapping's keys and values (a merge key's too: ``<<: *a``
    copies the aliased mapping's entries when the file is constructed, so they count)."""
    value = getattr(node, "value", None)
    if not isinstance(value, list):
        return None  # a scalar
    return [part for pair in value for part in pair] if value and isinstance(value[0], tuple) else list(value)


def file_error(path: Path, message: str) -> ConfigError:
    return ConfigError(f"config file {path}: {message}", option=str(path), value=str(path))


def _parser(suffix: str, path: Path) -> tuple[Callable[[str], Any], type[Exception], str]:
    """(loads, its error type, the format's name) for a config file; a missing library names its package."""
    if suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - exercised on Python 3.10 only
            try:
                import tomli as tomllib
            except ImportError:
                raise file_error(path, "reading TOML on Python 3.10 needs tomli: pip install tomli.") from None
        return tomllib.loads, tomllib.TOMLDecodeError, "TOML"
    try:
        import yaml
    except ImportError:
        raise file_error(path, "reading YAML needs PyYAML: pip install pyyaml (or use a .toml file).") from None
    return lambda text: _yaml_loads(yaml, text, path), yaml.YAMLError, "YAML"


class RepeatedKey(Exception):
    """A key given twice in one YAML mapping (the message says where)."""


def _yaml_loads(yaml: Any, text: str, path: Path) -> Any:
    """``yaml.safe_load``, bounded: the composed nodes (aliases still shared) are measured before anything is
    constructed (constructing copies what merge keys bring in); a key repeated in one mapping is refused (the
    YAML spec says keys are unique)."""

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise RepeatedKey(f"line {line}: the key {str(key)[:80]!r} is given twice in one table (first on "
                                      f"line {seen[key]}); YAML keeps only the last, so keep the one you mean.")
                seen[key] = line
            return super().construct_mapping(node, deep)

    loader = UniqueKeyLoader(text)  # a SafeLoader subclass: no Python objects
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_bounds(node, path, _node_children)
        return loader.construct_document(node)
    finally:
        loader.dispose()
