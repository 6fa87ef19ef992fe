"""Device platforms: which accelerator this process runs on, and how to talk to it.

Platforms are registry components (kind ``platform``): core registers ``cpu`` and ``cuda``,
twinkle-npu registers ``npu``. Detection asks each registered platform ``is_available()`` and
takes the available one with the highest ``priority``; ``TWINKLE_DEVICE`` forces a choice.
"""

from __future__ import annotations

import os
from typing import ClassVar

from twinkle.registry import get_registry

DEVICE_ENV = "TWINKLE_DEVICE"


class Platform:
    """What a device family provides to the runtime. Subclasses override the class attributes."""

    name: ClassVar[str] = ""
    device_type: ClassVar[str] = ""
    #: torch.distributed backend string. Accelerators pair their collective library with gloo
    #: (``"cpu:gloo,cuda:nccl"``) so object collectives and checkpoint agreement keep a CPU path.
    dist_backend: ClassVar[str] = "gloo"
    priority: ClassVar[int] = 0

    @classmethod
    def is_available(cls) -> bool:
        return False

    @classmethod
    def device_count(cls) -> int:
        return 0

    @classmethod
    def set_device(cls, local_rank: int) -> None:
        """Bind this process to its device (no-op where there is nothing to bind)."""

    @classmethod
    def device(cls, local_rank: int = 0):
        """This rank's device: index ``local_rank`` modulo the visible devices, as ``set_device`` binds it."""
        import torch

        count = cls.device_count()
        return torch.device(cls.device_type, local_rank % count) if count else torch.device(cls.device_type)

    @classmethod
    def bind(cls, local_rank: int) -> dict:
        """Bind this process to its device; returns what binds the process group to it as well.

        The ``init_process_group`` keyword arguments: ``device_id`` (this rank's device) on an
        accelerator, so NCCL/HCCL set up on the right device at once; nothing on the CPU.
        """
        cls.set_device(local_rank)
        return {"device_id": cls.device(local_rank)} if cls.device_count() else {}

    @classmethod
    def comm_device(cls):
        """The device of tensors handed to collectives (``twinkle.collective``): this process's device."""
        return cls.device(int(os.environ.get("LOCAL_RANK", "0") or 0))

    # ------------------------------------------------ this process's place (upstream Twinkle's Platform API)
    # Static so ``patch.object(Platform, 'get_rank', ...)`` on the base reaches every caller, as upstream.
    @staticmethod
    def get_rank() -> int:
        """This process's global rank: the process group's once initialised, else ``$RANK``, else 0."""
        import sys

        dist = sys.modules.get("torch.distributed")  # torch not imported means no process group
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return _env_int("RANK", 0)

    @staticmethod
    def get_world_size() -> int:
        """How many processes the job has: the process group's, else ``$WORLD_SIZE``, else 1."""
        import sys

        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return _env_int("WORLD_SIZE", 1)

    @staticmethod
    def get_local_rank() -> int:
        """This process's rank on its node (``$LOCAL_RANK``, else 0)."""
        return _env_int("LOCAL_RANK", 0)

    @staticmethod
    def get_local_world_size() -> int:
        """Processes on this node (``$LOCAL_WORLD_SIZE``, else 1)."""
        return _env_int("LOCAL_WORLD_SIZE", 1)

    @staticmethod
    def get_nnodes() -> int:
        """Nodes of the job: world size over the processes per node."""
        return max(1, Platform.get_world_size() // max(1, Platform.get_local_world_size()))

    @staticmethod
    def get_node_rank() -> int:
        """This node's index (``$GROUP_RANK`` as torchrun sets it, else ``$NODE_RANK``, else 0)."""
        return _env_int("GROUP_RANK", _env_int("NODE_RANK", 0))

    @staticmethod
    def is_master() -> bool:
        """Whether this is global rank 0."""
        return Platform.get_rank() == 0

    @staticmethod
    def is_local_master() -> bool:
        """Whether this is the first process of its node."""
        return Platform.get_local_rank() == 0

    @staticmethod
    def is_last_rank() -> bool:
        """Whether this is the last global rank."""
        return Platform.get_rank() == Platform.get_world_size() - 1

    @staticmethod
    def device_prefix(platform: str | None = None) -> str:
        """The torch device type (``'cpu'``, ``'cuda'``, ``'npu'``) of ``platform`` or of the detected one."""
        return detect_platform(platform).device_type

    @staticmethod
    def get_platform(platform: str | None = None) -> type[Platform]:
        """The platform class named ``platform``, or the detected one (see :func:`detect_platform`)."""
        return detect_platform(platform)

    @staticmethod
    def get_local_device(idx: int | None = None, *, platform: str | None = None):
        """The device of local index ``idx`` (default: this process's ``LOCAL_RANK``) on the platform."""
        found = detect_platform(platform)
        return found.device(Platform.get_local_rank() if idx is None else idx)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value.strip() else default
    except ValueError:
        raise ValueError(f"${name}={value!r} is not an integer; the launcher sets it to a process index.") from None


class CPUPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = 0

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def device_count(cls) -> int:
        return 0

    @classmethod
    def device(cls, local_rank: int = 0):
        import torch

        return torch.device("cpu")


class CUDAPlatform(Platform):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "cpu:gloo,cuda:nccl"
    priority = 10

    @classmethod
    def is_available(cls) -> bool:
        import torch

        return torch.cuda.is_available()

    @classmethod
    def device_count(cls) -> int:
        import torch

        return torch.cuda.device_count()

    @classmethod
    def set_device(cls, local_rank: int) -> None:
        import torch

        torch.cuda.set_device(local_rank % max(1, torch.cuda.device_count()))

    @classmethod
    def comm_device(cls):
        import torch

        return torch.device("cuda", torch.cuda.current_device())


def platforms() -> dict[str, type[Platform]]:
    """Every registered platform class by name (imports each platform module); a broken one is skipped, warned."""
    from twinkle.errors import ComponentLoadError

    registry = get_registry()
    found: dict[str, type[Platform]] = {}
    for name in registry.names("platform"):
        try:
            found[name] = registry.load("platform", name)
        except ComponentLoadError as exc:
            _warn(f"twinkle platform {name!r} could not be loaded and is ignored: {exc}")
    return found


def is_available(name: str, platform: type[Platform]) -> bool:
    """``platform.is_available()``; a platform whose check raises is unavailable (with a warning naming its plugin)."""
    try:
        return bool(platform.is_available())
    except Exception as exc:  # noqa: BLE001 - a third-party driver probe must not stop device detection
        component = get_registry().get("platform", name)
        _warn(f"twinkle platform {name!r} from {component.distribution} {component.version}: is_available() raised "
              f"{type(exc).__name__}: {exc}; it is treated as unavailable. Fix its driver or uninstall "
              f"{component.distribution}.")
        return False


def _warn(message: str) -> None:
    import warnings

    from twinkle.plugins import TwinklePluginWarning

    warnings.warn(message, TwinklePluginWarning, stacklevel=3)


def detect_platform(name: str | None = None) -> type[Platform]:
    """The platform to use: ``name``, else ``$TWINKLE_DEVICE``, else the best available one."""
    registry = get_registry()
    wanted = name or os.environ.get(DEVICE_ENV)
    if wanted:
        platform = registry.load("platform", wanted)
        if not is_available(wanted, platform):
            raise RuntimeError(
                f"Platform {wanted!r} was requested (argument or ${DEVICE_ENV}) but is not available on this "
                f"machine. Available: {', '.join(n for n, p in platforms().items() if is_available(n, p))}."
            )
        return platform
    available = [p for n, p in platforms().items() if is_available(n, p)]
    return max(available, key=lambda p: p.priority) if available else CPUPlatform
