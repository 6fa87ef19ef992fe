"""twinkle-server: a Tinker-compatible multi-tenant training service (``twinkle serve``).

Every client model is a LoRA tenant of one shared twinkle model; the service calls the same
TwinkleModel API a training script calls (see :mod:`twinkle_server.engine`). Start it with
``twinkle serve`` (docs/server.md); in Python, :func:`twinkle_server.server.build_service` and
:func:`twinkle_server.app.create_app` give the pieces.
"""

__version__ = "0.1.0"
