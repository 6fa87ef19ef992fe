"""Build the service from a :class:`ServerConfig` and run it under uvicorn (one process).

Order: runtime (``twinkle.initialize``, seeded: a ``twinkle://`` base model's random init is the
same on every start) -> the shared multi-tenant model from the registry (local, or Ray actors with
``--infra.mode ray``) -> registry recovery -> HTTP. On start it prints the URL and the two
environment variables that point the ``tinker`` client at it, and writes them to
``<work_dir>/server.json``.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from twinkle_server.auth import KeyStore
from twinkle_server.config import ServerConfig, hub_id
from twinkle_server.engine import Engine
from twinkle_server.images import ImageInputs, template_name
from twinkle_server.paths import CheckpointDirs
from twinkle_server.service import Service
from twinkle_server.store import Store
from twinkle_server.targets import layer_families, tokenizer_dir, vocab_size

logger = logging.getLogger("twinkle_server")
#: The interpreter's thread switch interval while serving (Python's default is 5 ms).
SWITCH_INTERVAL_S = 0.001
#: A request's line and headers may have this many bytes. h11's default (16 KiB) answers a longer URL by closing
#: the connection mid-upload, which the client sees as a reset; read up to this, so the app answers it (4xx).
MAX_REQUEST_HEAD_BYTES = 1 << 20


def build_model(config: ServerConfig, targets: dict[str, list[str]]) -> Any:
    """The shared model: ``config.model`` built as the Trainer builds it, with one LoRA slot per tenant."""
    from twinkle import launch
    from twinkle.config import ConfigError
    from twinkle.model import MultiTenantModel
    from twinkle.registry import resolve

    cls = resolve("model", config.model.type)
    if not (isinstance(cls, type) and issubclass(cls, MultiTenantModel)):
        raise ConfigError(f"model.type: {config.model.type} serves one adapter; twinkle serve needs a multi-tenant "
                          "model (one that implements twinkle.model.MultiTenantModel), e.g. MultiLoraTransformersModel "
                          "or MultiLoraMegatronModel.")
    server = config.server
    if config.infra.mode == "local":  # a random-init base (twinkle:// assets) then depends on the seed only
        from twinkle.runtime import seed_everything

        seed_everything(server.seed)
    return launch.build_model(config.model, config.infra, strict_load=False, max_loras=server.max_tenants,
                              max_r=server.max_rank, max_length=server.max_length,
                              target_modules=[m for names in targets.values() for m in names])


def build_service(config: ServerConfig) -> Service:
    """Everything but the HTTP listener; the service's worker is started."""
    from twinkle import launch
    from twinkle.hub import resolve_path

    work_dir = Path(config.server.work_dir).expanduser().resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    store = Store(work_dir / "registry.sqlite")
    launch.start(config.infra, config.server.seed)
    model_path = resolve_path(config.model.model_id)
    targets = layer_families(model_path)
    model = build_model(config, targets)
    tokenizer = tokenizer_dir(model_path)
    batching = config.server.batching
    images = ImageInputs.for_model(model_path, config.model.model_id)
    if batching and images is not None:
        logger.info("batched multi-tenant steps are off for a vision-language model (rows carry images); tenants "
                    "take turns")
        batching = False
    if batching and config.infra.mode == "ray" and config.infra.dp_size > 1:
        # forward_backward_multi reaches every rank with all rows (no per-tenant data split): per-tenant steps,
        # which slice each tenant's rows over the data-parallel ranks, stay exact
        logger.info("batched multi-tenant steps are off with infra.dp_size > 1; tenants take turns")
        batching = False
    server = config.server
    sampler, no_sampler = build_sampler(config, model, tokenizer)
    engine = Engine(model, targets, lora_alpha=server.lora_alpha, max_rank=server.max_rank, batching=batching,
                    sampler=sampler, no_sampler=no_sampler, slots=server.max_tenants, work_dir=work_dir,
                    # ray mode: the actors write the pages; only the work dir is theirs and ours alike
                    page_memory_bytes=int(server.page_memory_mb * 1024 * 1024) if config.infra.mode == "local" else 0,
                    grad_hold_s=server.grad_hold_s,
                    vocab_size=vocab_size(model_path),
                    template=None if images is None else (template_name(model_path), config.model.model_id))
    arch = json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    tokenizer_id = hub_id(config.model.model_id) or tokenizer
    service = Service(config, engine, store, CheckpointDirs(work_dir), arch=arch, tokenizer_id=tokenizer_id)
    service.limits.images = images
    service.start()
    return service


def build_sampler(config: ServerConfig, model: Any, tokenizer: str | None) -> tuple[Any, str | None]:
    """``(TorchSampler on the shared model's own weights, None)``, or ``(None, why not)``: a Ray proxy has no
    local weights, and a backend without a sampler (Megatron) cannot sample. The reason reaches the client.

    The tokenizer serves stop strings; without one only stop token ids work.
    """
    if config.infra.mode != "local":
        return None, "sampling needs the local mode (--infra.mode local): a Ray proxy holds no weights here"
    try:
        from twinkle.registry import resolve

        loaded = None
        if tokenizer is not None:
            from transformers import AutoTokenizer

            loaded = AutoTokenizer.from_pretrained(tokenizer)
        return resolve("sampler", "TorchSampler")(model, tokenizer=loaded), None
    except Exception as exc:  # noqa: BLE001 - a server without sampling still trains
        logger.warning("no sampler (%s: %s); sampling requests will be refused", type(exc).__name__, exc)
        return None, str(exc)


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening socket (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(config: ServerConfig) -> int:
    """Run until interrupted: build, listen, print where, serve."""
    import uvicorn

    from twinkle_server.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # the worker thread holds the GIL between torch calls; switching more often keeps the HTTP threads (polls,
    # submissions, healthz) responsive while it samples or trains
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    keys = _keys(config)
    sock = listen(config.server.host, config.server.port)
    service = build_service(config)
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}"
    _announce(config, url)
    stop = threading.Event()
    threading.Thread(target=_housekeeping, args=(service, stop), daemon=True, name="housekeeping").start()
    server = uvicorn.Server(uvicorn.Config(create_app(service, keys), log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=5,
                                           h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES))
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        service.stop()
        from twinkle import launch

        launch.stop(config.infra)  # ray mode: the model actors (and a Ray it started) stop
    return 0


def _keys(config: ServerConfig) -> KeyStore:
    from twinkle.config import check_required

    check_required(config)  # the keys file (a config built in Python skips the command line's check)
    return KeyStore.from_file(config.server.api_keys_file)


def _announce(config: ServerConfig, url: str) -> None:
    work_dir = Path(config.server.work_dir).expanduser().resolve()
    info = {"url": url, "base_model": config.base_model_name, "work_dir": str(work_dir)}
    (work_dir / "server.json").write_text(json.dumps(info))
    print(f"twinkle serve: serving {config.base_model_name!r} at {url} (work dir {work_dir})\n"
          f"  point the tinker client at it:\n"
          f"    export TINKER_BASE_URL={url}\n"
          f"    export TINKER_API_KEY=<a key from `twinkle serve keygen`>\n"
          f"  then: tinker.ServiceClient().create_lora_training_client(base_model={config.base_model_name!r})\n"
          f"  metrics: {url}/metrics", flush=True)


def _housekeeping(service: Service, stop: threading.Event) -> None:
    """Session expiry, futures pruning and the periodic metrics log line."""
    every = service.config.server.metrics_log_s
    last_log = time.monotonic()
    while not stop.wait(5.0):
        try:
            service.expire_sessions()
            service.expire_checkpoints()
            service.futures.prune()
            if every and time.monotonic() - last_log >= every:
                last_log = time.monotonic()
                logger.info("metrics: %s", service.metrics.log_line())
        except Exception:  # noqa: BLE001 - housekeeping must never stop the server
            logger.exception("housekeeping failed")
