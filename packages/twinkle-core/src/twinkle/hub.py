"""One resolver for every model and dataset id twinkle accepts, shared by datasets, templates and backends.

``ms://org/name``   ModelScope: ``modelscope.snapshot_download`` (optional extra ``twinkle-core[modelscope]``)
``hf://org/name``   Hugging Face Hub: ``huggingface_hub.snapshot_download`` (honours HF_HUB_OFFLINE / the cache)
``twinkle://NAME``  a file embedded in twinkle-core (:mod:`twinkle.assets`)
anything else       a local file or directory

The answer is always a local path, so callers load everything the same way. An id that does not
resolve raises a :class:`HubError` (``.id`` is the id as given) saying what was tried and why it
failed: no such local path, not in the cache while offline, the hub unreachable, no such
repository, or the hub's client not installed. ``twinkle train`` prefixes it with the option that
holds the id.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from twinkle.errors import TwinkleError

MS_PREFIX = "ms://"
HF_PREFIX = "hf://"
ASSET_PREFIX = "twinkle://"
REPO_TYPES = ("model", "dataset")
#: What a bare hub id looks like (``org/name``): only then is ``hf://`` / ``ms://`` suggested for a missing path.
HUB_ID_SHAPE = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9]")

RepoType = Literal["model", "dataset"]


class HubError(TwinkleError):
    """A model or dataset id that does not resolve to a local path: ``id`` as given, and ``reason``."""

    def __init__(self, id: str, reason: str) -> None:
        super().__init__(f"{id!r}: {reason}")
        self.id = id
        self.reason = reason

    def __reduce__(self) -> tuple:  # picklable (a Ray actor's error crosses processes)
        return type(self), (self.id, self.reason)


class IdNotFoundError(HubError, FileNotFoundError):
    """No such local path, or a hub repository that is neither downloadable nor in the cache."""


class HubClientMissingError(HubError, ImportError):
    """The hub's client library is not installed (``ms://`` without modelscope)."""


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
    hint = (f"for a hub {repo_type} write 'hf://{text}' (Hugging Face) or 'ms://{text}' (ModelScope)"
            if HUB_ID_SHAPE.fullmatch(text) else
            "hub ids start with hf:// or ms://, twinkle's embedded files with twinkle:// (twinkle://tiny-qwen, "
            "twinkle://self-cognition)")
    raise IdNotFoundError(text, f"no such local file or directory ({os.path.abspath(path)}); {hint}.")


def _repo_id(text: str, prefix: str) -> str:
    repo_id = text[len(prefix):].strip("/")
    if not repo_id or " " in repo_id or repo_id.count("/") > 1:
        raise ValueError(f"{text!r} is not a valid hub id; expected {prefix}org/name.")
    return repo_id


def _modelscope(repo_id: str, repo_type: str, revision: str | None, allow_patterns: list[str] | None) -> str:
    text = MS_PREFIX + repo_id
    try:
        from modelscope import snapshot_download
    except ImportError:
        raise HubClientMissingError(
            text, "the ModelScope client is not installed: pip install 'twinkle-core[modelscope]'") from None
    kwargs: dict = {"repo_type": repo_type}
    if revision is not None:
        kwargs["revision"] = revision
    if allow_patterns is not None:
        kwargs["allow_patterns"] = allow_patterns
    try:
        return str(snapshot_download(repo_id, **kwargs))
    except Exception as exc:  # modelscope's errors have no stable hierarchy: say what it said
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise IdNotFoundError(
            text, f"the {repo_type} could not be downloaded from ModelScope and is not in its cache "
            f"({type(exc).__name__}{': ' + reason if reason else ''}); check the id and the network, or give a "
            "local directory.") from exc


def _huggingface(repo_id: str, repo_type: str, revision: str | None, allow_patterns: list[str] | None) -> str:
    from huggingface_hub import snapshot_download

    text = HF_PREFIX + repo_id
    try:
        return str(snapshot_download(repo_id=repo_id, repo_type=repo_type, revision=revision,
                                     allow_patterns=allow_patterns))
    except Exception as exc:
        reason = _hf_failure(exc, repo_type, revision)
        if reason is None:
            raise
        raise IdNotFoundError(text, reason) from exc


def _hf_failure(exc: Exception, repo_type: str, revision: str | None) -> str | None:
    """Why ``snapshot_download`` failed, in the user's terms; None for an error that is not about finding the id."""
    from huggingface_hub import constants

    try:
        from huggingface_hub import errors
    except ImportError:  # huggingface_hub < 0.23
        from huggingface_hub import utils as errors
    cache = constants.HF_HUB_CACHE
    if isinstance(exc, errors.GatedRepoError):
        return (f"a gated {repo_type} on the Hugging Face Hub: accept its terms on huggingface.co, then log in "
                "(`hf auth login` or HF_TOKEN).")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return (f"no such {repo_type} repository on the Hugging Face Hub (a private one needs a login: "
                "`hf auth login` or HF_TOKEN).")
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"the {repo_type} repository has no revision {revision!r} on the Hugging Face Hub."
    if isinstance(exc, errors.LocalEntryNotFoundError):
        cause = exc.__cause__ or exc.__context__
        if constants.HF_HUB_OFFLINE or isinstance(cause, errors.OfflineModeIsEnabled):
            return (f"not in the Hugging Face cache ({cache}) and downloads are off (HF_HUB_OFFLINE=1); unset "
                    "HF_HUB_OFFLINE to download it, or give a local directory.")
        why = f"{type(cause).__name__}: {cause}" if cause is not None else "no connection"
        return (f"the Hugging Face Hub ({constants.ENDPOINT}) could not be reached ({why}) and the {repo_type} "
                f"is not in the cache ({cache}); check the network (or HF_ENDPOINT), or give a local directory.")
    return None


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
