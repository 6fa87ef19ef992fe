"""twinkle: a modular LLM training workbench.

``import twinkle`` stays cheap: it imports neither torch nor any backend; those load on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"
