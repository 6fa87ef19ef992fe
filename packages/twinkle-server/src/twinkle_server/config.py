"""``twinkle serve``'s configuration: the served model, where it runs, and the service's own options.

A :mod:`twinkle.config` schema like the Trainer's: plain dataclasses validated eagerly, from a
YAML/TOML file and ``--group.field value`` options, every error naming the option. The ``model``
and ``infra`` groups are :mod:`twinkle.launch`'s, the Trainer's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from twinkle.config import Config, ConfigError, opt
from twinkle.launch import InfraConfig, ModelConfig

KEYGEN = "twinkle serve keygen OWNER --keys-file keys.txt"
#: The tinker client sends a session heartbeat this often (seconds); a shorter session timeout would end live sessions.
HEARTBEAT_S = 10


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
    base_model_name: str | None = opt(
        None, "the name clients pass as base_model; none = the hub id (org/name) of model.model_id, "
              "'twinkle/<name>' for an embedded model, the directory name for a local one (never a ':')")
    max_tenants: int = opt(4, "LoRA slots of the shared model: client models resident at once; idle ones are "
                              "paged out (least recently used) and back, so any number of models can exist", min=1)
    max_rank: int = opt(32, "slot rank: the largest LoraConfig.rank a client may ask for", min=1)
    max_length: int = opt(2048, "tokens per datum at most (prompt + max_tokens when sampling)", min=1)
    lora_alpha: int = opt(32, "LoRA alpha of every tenant (Tinker fixes it; scaling = alpha / rank)", min=1)
    seed: int = opt(0, "seeds the base model's random init (twinkle:// assets) and the slots")
    batching: bool = opt(True, "run steps of several tenants queued together as one batched step")
    batch_window_ms: float = opt(0.0, "with batching: how long a lone step waits for other tenants' steps",
                                 min=0.0)
    max_request_mb: float = opt(64.0, "largest request body in MB", gt=0.0)
    max_inflight_per_key: int = opt(64, "queued + running requests of one API key; more answer 429", min=1)
    max_tokens_per_request: int = opt(16384, "tokens in one forward/forward_backward request at most (the client "
                                             "splits larger batches); bounds one unit of training work", min=1)
    max_num_samples: int = opt(256, "num_samples of one sample request at most", min=1)
    slice_ms: float = opt(100.0, "fair scheduling: a sample request runs in slices of about this long, so other "
                                 "keys' work runs in between", gt=0.0)
    max_learning_rate: float = opt(10.0, "AdamParams.learning_rate above this is refused", gt=0.0)
    page_memory_mb: float = opt(1024.0, "host memory (tmpfs) for paged-out models; beyond it they go to the work dir",
                                min=0.0)
    grad_hold_s: float = opt(60.0, "a model with gradients not yet applied (forward_backward without optim_step) "
                                   "keeps its slot this long idle before it may be paged out (its gradients are "
                                   "then dropped and its next optim_step says so)", min=0.0)
    checkpoint_ttl_s: float = opt(0.0, "default TTL of save_state / save_weights_for_sampler checkpoints when the "
                                       "client sends none; 0: never expire", min=0.0)
    snapshot_ttl_s: float = opt(86400.0, "TTL of the weights save_weights_and_get_sampling_client saves (listed as "
                                         "sampler checkpoints); 0: never expire", min=0.0)
    session_timeout_s: float = opt(600.0, "a session without heartbeat this long ends and its models unload; "
                                          "0: never; at least 30 (the client heartbeats every 10 s)",
                                   min=float(HEARTBEAT_S * 3), also=(0.0,))
    long_poll_s: float = opt(5.0, "retrieve_future waits this long for a result before answering try_again",
                             gt=0.0)
    metrics_log_s: float = opt(30.0, "how often the per-tenant metrics are logged; 0: never", min=0.0)

    def check(self) -> None:
        if self.max_tokens_per_request < self.max_length:
            raise ConfigError(f"max_tokens_per_request={self.max_tokens_per_request} is below max_length="
                              f"{self.max_length}: one datum could never be sent; raise it or lower max_length.",
                              option="--server.max-tokens-per-request")

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
        return self.server.base_model_name or served_name(self.model.model_id)

    @property
    def base_model_aliases(self) -> tuple[str, ...]:
        """Names a client may pass as ``base_model``: the served name and the model id as configured."""
        return tuple(dict.fromkeys((self.base_model_name, self.model.model_id)))


def hub_id(model_id: str) -> str | None:
    """``org/name`` of a hub model id (``ms://org/name``, ``hf://org/name``); None for anything else."""
    for prefix in ("ms://", "hf://"):
        if model_id.startswith(prefix):
            return model_id[len(prefix):].strip("/")
    return None


def served_name(model_id: str) -> str:
    """The base-model name clients see: no ':' (the client cuts names there, Tinker's ``model:variant``).

    A hub model: its hub id (``Qwen/Qwen3-0.6B``); an embedded one: ``twinkle/<name>``; a local
    directory: its name.
    """
    found = hub_id(model_id)
    if found is not None:
        return found
    if model_id.startswith("twinkle://"):
        return "twinkle/" + model_id[len("twinkle://"):].strip("/")
    return Path(model_id.rstrip("/")).name.replace(":", "-") or "model"
