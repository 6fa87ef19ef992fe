"""``twinkle serve``'s configuration: the served model, where it runs, and the service's own options.

Built like the Trainer's (``twinkle.trainer.config``): plain dataclasses validated eagerly, from a
YAML/TOML file and ``--group.field value`` overrides, every error naming the dotted field. The
``model`` and ``infra`` groups are the Trainer's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from twinkle.trainer._validate import ConfigError
from twinkle.trainer.config import InfraConfig, ModelConfig


@dataclass
class ServedModelConfig(ModelConfig):
    """The shared base model; ``type`` is a registered multi-tenant model class."""

    type: str = "MultiLoraTransformersModel"


@dataclass
class ServiceConfig:
    """The HTTP service, its tenants and its limits."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0: a free port, printed at start
    work_dir: str = "twinkle-server"
    api_keys_file: str | None = None  # lines "<owner> <sha256 hex>"; `twinkle serve keygen` writes them
    base_model_name: str | None = None  # the name clients pass as base_model; default: model.model_id
    max_tenants: int = 4  # LoRA slots of the shared model (MultiLora max_loras)
    max_rank: int = 32  # slot rank (max_r): the largest LoraConfig.rank a client may ask for
    max_length: int = 2048  # tokens per datum
    lora_alpha: int = 32  # Tinker fixes alpha; scaling is lora_alpha / rank
    seed: int = 0  # seeds the base model's random init (twinkle:// assets) and the slots
    batching: bool = True  # run steps of several tenants queued together as one forward_backward_multi
    batch_window_ms: float = 0.0  # with batching: how long a lone step waits for other training tenants' steps
    max_request_mb: float = 64.0
    max_inflight_per_key: int = 64  # queued + running requests of one API key; more answer 429
    session_timeout_s: float = 600.0  # no heartbeat for this long: the session ends, its models unload; 0: never
    long_poll_s: float = 5.0  # retrieve_future waits this long for a result before answering try_again
    metrics_log_s: float = 30.0  # how often the per-tenant metrics are logged; 0: never

    def __post_init__(self) -> None:
        for name in ("max_tenants", "max_rank", "max_length", "lora_alpha", "max_inflight_per_key"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)!r}.")
        for name in ("max_request_mb", "long_poll_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}: must be > 0, got {getattr(self, name)!r}.")
        for name in ("session_timeout_s", "metrics_log_s", "batch_window_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0 (0 turns it off), got {getattr(self, name)!r}.")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port: must be in 0..65535, got {self.port!r}.")

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 1024 * 1024)


@dataclass
class ServerConfig:
    """Everything ``twinkle serve`` needs: ``model``, ``infra`` (the Trainer's groups) and ``server``."""

    model: ServedModelConfig = field(default_factory=ServedModelConfig)
    infra: InfraConfig = field(default_factory=InfraConfig)
    server: ServiceConfig = field(default_factory=ServiceConfig)

    @property
    def base_model_name(self) -> str:
        return self.server.base_model_name or self.model.model_id
