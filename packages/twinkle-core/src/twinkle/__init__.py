"""twinkle: a modular LLM training workbench.

``import twinkle`` stays cheap: it imports neither torch nor any backend; those load on first use.
"""

from __future__ import annotations

from twinkle.log import get_logger
from twinkle.mesh import DeviceGroup, DeviceMesh
from twinkle.placement import get_device_placement
from twinkle.platform import Platform
from twinkle.remote import remote_class, remote_function
from twinkle.runtime import get_device_mesh, get_runtime, initialize, shutdown
from twinkle.types import InputFeature, ModelOutput
from twinkle.version import __version__

__all__ = [
    "DeviceGroup",
    "DeviceMesh",
    "InputFeature",
    "ModelOutput",
    "Platform",
    "__version__",
    "get_device_mesh",
    "get_device_placement",
    "get_logger",
    "get_runtime",
    "initialize",
    "remote_class",
    "remote_function",
    "shutdown",
]
