"""``twinkle serve``'s configuration: the served model, where it runs, and the service's own options.

A :mod:`twinkle.config` schema like the Trainer's: plain dataclasses validated eagerly, from a
YAML/TOML file and ``--group.field value`` options, every error naming the option. The ``model``
and ``infra`` groups are :mod:`twinkle.launch`'s, the Trainer's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from twinkle.config import Config, opt
from twinkle.launch import InfraConfig, ModelConfig

KEYGEN = "twinkle serve keygen OWNER --keys-file keys.txt"


@dataclass
class ServedModelConfig(ModelConfig):
    """The shared base model; ``type`` is a registered multi-tenant model class."""

    type: str = opt("MultiLoraTransformersModel", "registered multi-tenant model class (twinkle plugins --kind model)")


@dataclass
class ServiceConfig(Config):
    """The HTTP service, its tenants and its limits."""

    host: str = opt("127.0.0.1", "address to listen on")
    port: int = opt(8000, "port to listen on; 0: a free port, printed at start", min=0, max=65535)
    work_dir: str | Path = opt("twinkle-server", "where the registry, checkpoints and server.json go")
    api_keys_file: str | Path | None = opt(
        None, "API keys: lines '<owner> <sha256 hex>', written by `twinkle serve keygen`",
        required=f"create a key with `{KEYGEN}` and start with --server.api-keys-file keys.txt.")
    base_model_name: str | None = opt(None, "the name clients pass as base_model; none = model.model_id")
    max_tenants: int = opt(4, "LoRA slots of the shared model (client models loaded at once)", min=1)
    max_rank: int = opt(32, "slot rank: the largest LoraConfig.rank a client may ask for", min=1)
    max_length: int = opt(2048, "tokens per datum at most", min=1)
    lora_alpha: int = opt(32, "LoRA alpha of every tenant (Tinker fixes it; scaling = alpha / rank)", min=1)
    seed: int = opt(0, "seeds the base model's random init (twinkle:// assets) and the slots")
    batching: bool = opt(True, "run steps of several tenants queued together as one batched step")
    batch_window_ms: float = opt(0.0, "with batching: how long a lone step waits for other tenants' steps",
                                 min=0.0)
    max_request_mb: float = opt(64.0, "largest request body in MB", gt=0.0)
    max_inflight_per_key: int = opt(64, "queued + running requests of one API key; more answer 429", min=1)
    session_timeout_s: float = opt(600.0, "a session without heartbeat this long ends and its models unload; "
                                          "0: never", min=0.0)
    long_poll_s: float = opt(5.0, "retrieve_future waits this long for a result before answering try_again",
                             gt=0.0)
    metrics_log_s: float = opt(30.0, "how often the per-tenant metrics are logged; 0: never", min=0.0)

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 1024 * 1024)


@dataclass
class ServerConfig(Config):
    """Everything ``twinkle serve`` needs: ``model``, ``infra`` (the Trainer's groups) and ``server``."""

    model: ServedModelConfig = opt(factory=ServedModelConfig)
    infra: InfraConfig = opt(factory=InfraConfig)
    server: ServiceConfig = opt(factory=ServiceConfig)

    @property
    def base_model_name(self) -> str:
        return self.server.base_model_name or self.model.model_id
