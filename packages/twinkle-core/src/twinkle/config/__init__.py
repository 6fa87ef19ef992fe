"""One configuration layer for ``twinkle train``, the ``Trainer``, ``twinkle serve`` and scripts' ``CLI``.

- a schema: a dataclass whose fields are declared with :func:`opt` (help, choices, range, aliases,
  required-ness) and whose dataclass-typed fields are groups (``optimizer.lr``) — :func:`schema_of`;
- one coercer (:func:`coerce`) and one error type (:class:`ConfigError`, naming the option as written);
- :func:`load_file`: a YAML/TOML file, bounded before it is expanded (size, values behind aliases, depth);
- sources: :func:`from_mapping`, :func:`from_env`, :func:`from_argv`
  (``--group.field value``, the field alone when unique, ``--flag``/``--no-flag``);
- :func:`build` (layers -> the config object) and :class:`Config` (fields checked on construction);
- :func:`render_help` (one line per option).

Only the standard library is imported; PyYAML only when a YAML file is read.
"""

from twinkle.config.build import Config, build, check_required
from twinkle.config.files import load_file
from twinkle.config.help import render_help
from twinkle.config.schema import ConfigError, Schema, Spec, opt, resolve, schema_of
from twinkle.config.sources import Layer, from_argv, from_env, from_mapping
from twinkle.config.values import coerce

__all__ = [
    "Config",
    "ConfigError",
    "Layer",
    "Schema",
    "Spec",
    "build",
    "check_required",
    "coerce",
    "from_argv",
    "from_env",
    "from_mapping",
    "load_file",
    "opt",
    "render_help",
    "resolve",
    "schema_of",
]
