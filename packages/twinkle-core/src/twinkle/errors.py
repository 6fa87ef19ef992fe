"""Exceptions raised by the registry. Each message says what was asked, what exists, and what to do."""

from __future__ import annotations


class TwinkleError(Exception):
    """Base of twinkle's own errors."""


class UnknownKindError(TwinkleError, ValueError):
    """A component kind that twinkle does not define."""


class ComponentNotFoundError(TwinkleError, LookupError):
    """No installed plugin registers this name for this kind."""

    def __init__(self, message: str, *, kind: str, name: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.name = name


class MissingBackendError(ComponentNotFoundError, ImportError):
    """The name belongs to a twinkle package that is not installed."""

    def __init__(self, message: str, *, kind: str, name: str, package: str) -> None:
        ComponentNotFoundError.__init__(self, message, kind=kind, name=name)
        self.package = package
        self.msg = message


class DuplicateComponentError(TwinkleError, LookupError):
    """Two plugins register the same name for one kind and neither is marked as an override."""


class ComponentLoadError(TwinkleError, ImportError):
    """A registered component's lazy reference could not be imported."""
