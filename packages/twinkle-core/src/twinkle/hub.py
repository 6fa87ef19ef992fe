"""One resolver for every model and dataset id twinkle accepts, shared by datasets, templates and backends.

``ms://org/name``   ModelScope: ``modelscope.snapshot_download`` (optional extra ``twinkle-core[modelscope]``)
``hf://org/name``   Hugging Face Hub: ``huggingface_hub.snapshot_download`` (honours HF_HUB_OFFLINE / the cache)
``twinkle://NAME``  a file embedded in twinkle-core (:mod:`twinkle.assets`)
anything else       a local file or directory

The answer is always a local path, so callers load everything the same way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

MS_PREFIX = "ms://"
HF_PREFIX = "hf://"
ASSET_PREFIX = "twinkle://"
REPO_TYPES = ("model", "dataset")

RepoType = Literal["model", "dataset"]


def resolve_path(
    id_or_path: str | os.PathLike[str],
    repo_type: RepoType = "model",
    *,
    revision: str | None = None,
    allow_patterns: list[str] | None = None,
) -> str:
    """A local path for ``id_or_path``, downloading hub snapshots as needed (see the module docstring)."""
    if not isinstance(id_or_path, (str, os.PathLike)):
        raise TypeError(f"Expected a path or a hub id string, got {type(id_or_path).__name__}: {id_or_path!r}.")
    if repo_type not in REPO_TYPES:
        raise ValueError(f"repo_type must be one of {REPO_TYPES}, got {repo_type!r}.")
    text = os.fspath(id_or_path)
    if text.startswith(MS_PREFIX):
        return _modelscope(_repo_id(text, MS_PREFIX), repo_type, revision, allow_patterns)
    if text.startswith(HF_PREFIX):
        return _huggingface(_repo_id(text, HF_PREFIX), repo_type, revision, allow_patterns)
    if text.startswith(ASSET_PREFIX):
        from twinkle.assets import asset_path

        return str(asset_path(text[len(ASSET_PREFIX):]))
    path = Path(text).expanduser()
    if path.exists():
        return os.path.abspath(path)  # not resolve(): a symlinked data file must keep its own name and suffix
    raise FileNotFoundError(
        f"{text!r} is not an existing local path. For a hub {repo_type} write 'ms://{text}' (ModelScope) or "
        f"'hf://{text}' (Hugging Face); for twinkle's embedded files use 'twinkle://self-cognition' or "
        "'twinkle://tiny-qwen'."
    )


def _repo_id(text: str, prefix: str) -> str:
    repo_id = text[len(prefix):].strip("/")
    if not repo_id or " " in repo_id or repo_id.count("/") > 1:
        raise ValueError(f"{text!r} is not a valid hub id; expected {prefix}org/name.")
    return repo_id


def _modelscope(repo_id: str, repo_type: str, revision: str | None, allow_patterns: list[str] | None) -> str:
    try:
        from modelscope import snapshot_download
    except ImportError as exc:
        raise ImportError(
            f"'ms://{repo_id}' needs the ModelScope client: pip install 'twinkle-core[modelscope]'"
        ) from exc
    kwargs: dict = {"repo_type": repo_type}
    if revision is not None:
        kwargs["revision"] = revision
    if allow_patterns is not None:
        kwargs["allow_patterns"] = allow_patterns
    return str(snapshot_download(repo_id, **kwargs))


def _huggingface(repo_id: str, repo_type: str, revision: str | None, allow_patterns: list[str] | None) -> str:
    from huggingface_hub import snapshot_download

    return str(snapshot_download(repo_id=repo_id, repo_type=repo_type, revision=revision,
                                 allow_patterns=allow_patterns))


def portable_id(model_id: str | None) -> str | None:
    """What a checkpoint names as its base (``adapter_config.json``'s ``base_model_name_or_path``): the id the
    user gave, never a path into a cache or into twinkle's install.

    ``ms://org/name`` and ``hf://org/name`` become ``org/name`` (what peft's ``AutoPeftModel`` and the hubs'
    clients load); ``twinkle://NAME`` (an embedded model, :func:`resolve_path` finds it) and a path are kept as
    the user wrote them. None: nothing to say (a model built from a config).
    """
    if not model_id:
        return None
    text = str(model_id)
    for prefix in ("ms://", "hf://"):
        if text.startswith(prefix):
            return text[len(prefix):].strip("/")
    return text
