"""LoRA slots on a peft model, and the rank-sliced, row-routed LoRA forward that serves tenants.

Every slot is a peft LoRA adapter of rank ``max_r`` on the same modules. peft's own adapter path
is switched off on those layers; a forward hook adds each tenant's LoRA instead:

    out[rows] += dropout_t(x[rows]) @ A[:r_t].T @ B[:, :r_t].T * scaling_t      (targeted layers only)

so a tenant with ``r_t < max_r`` trains exactly an ``r_t``-rank adapter (the unused ranks get no
gradient and are kept at zero), with its own scaling (``lora_alpha / r`` or ``/ sqrt(r)`` with
rslora), dropout and target modules. A *route* says which tenant owns which rows of the batch:
one tenant for the whole batch (time-sharing) or several row ranges (batched multi-tenant step: all
tenants' rows through two matmuls per layer, :mod:`twinkle_hf.multi_lora.grouped`).
The hook raises when called outside a route, so nothing ever falls back to some slot silently.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.tuners.tuners_utils import check_target_module_exists

from twinkle.engine import Route
from twinkle.hub import portable_id
from twinkle.model.lora_targets import with_default_targets
from twinkle.model.optimizer_group import OptimizerGroup
from twinkle.multi_lora import LoraTenant, TenantSpec
from twinkle_hf.multi_lora.grouped import GroupedDelta
from twinkle_hf.multi_lora.sharded import assign, full, is_sharded

#: LoraConfig fields a slot cannot honour, with the value it must keep.
_UNSUPPORTED = {"use_dora": False, "lora_bias": False, "bias": "none", "modules_to_save": None,
                "layers_to_transform": None, "fan_in_fan_out": False, "init_lora_weights": True}


def matches(config: LoraConfig, name: str) -> bool:
    """Whether ``config`` targets module ``name`` (peft returns a truthy marker for excluded modules)."""
    hit = check_target_module_exists(config, name)
    return bool(hit) and type(hit).__name__ != "_ExcludedModule"


@dataclass
class SlotRoute:
    """Rows ``start:stop`` of the batch (``None``: all rows) go through ``spec``'s LoRA."""

    spec: TenantSpec
    start: int | None = None
    stop: int | None = None


class LoraSlots:
    """The slots part of a multi-LoRA :class:`~twinkle_hf.model.backend.HFBackend`.

    Three roles: the tensor side of the slots (creation, initial weights, tenant specs, the routed
    forward); the :class:`twinkle.multi_lora.SlotBackend` of the tenant router; and the backend's
    adapters part (routes of a forward, the parameters a tenant trains, its adapter files).
    """

    def __init__(self, backend: Any, slot_config: LoraConfig) -> None:
        self.backend = backend
        self.slot_config = slot_config
        self.layers: dict[str, LoraLayer] = {}
        self.initial: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.specs: dict[str, TenantSpec] = {}
        self.configs: dict[str, LoraConfig] = {}  # the LoraConfig each slot's tenant acquired it with
        self.unused: dict[str, list[torch.Tensor]] = {}  # per slot: views of what its tenant does not train
        self.routes: Sequence[SlotRoute] | None = None
        self._grouped = GroupedDelta()  # several tenants' rows: one pass per layer

    def _hook(self, layers: dict[str, LoraLayer]) -> None:
        self.layers = layers
        for name, layer in layers.items():
            layer._disable_adapters = True  # the hook below replaces peft's adapter path
            layer.register_forward_hook(self._forward_hook(name))

    @classmethod
    def lora_layers(cls, hf_model: torch.nn.Module) -> dict[str, LoraLayer]:
        """Module name -> peft LoRA layer; only Linear layers can hold slots."""
        layers = {}
        for name, module in hf_model.named_modules():
            if isinstance(module, LoraLayer):
                if not isinstance(module.get_base_layer(), torch.nn.Linear):
                    raise ValueError(f"LoRA slots support Linear layers only; {name!r} is "
                                     f"{type(module.get_base_layer()).__name__}. Narrow target_modules.")
                layers[name] = module
        return layers

    # ------------------------------------------------------------ SlotBackend
    def slot_targets(self) -> frozenset[str]:
        return frozenset(self.layers)

    def create_slot(self, tenant: LoraTenant) -> None:
        """Add peft adapter ``tenant.adapter_name`` (rank max_r) and snapshot its initial weights."""
        from twinkle_hf.model.meta import adapters_stay_real

        backend = self.backend
        with adapters_stay_real(backend.module):  # memory_efficient_init: the base waits on meta for rank 0's weights
            if not self.layers:
                backend.module = get_peft_model(backend.module, tenant.config, adapter_name=tenant.adapter_name)
                self._hook(self.lora_layers(backend.hf_model()))
            else:
                backend.module.add_adapter(tenant.adapter_name, tenant.config)
        self.snapshot(tenant.adapter_name)

    def complete_tenant_config(self, config: Any) -> Any:
        """No target_modules: peft's defaults for this model type, as get_peft_model would choose."""
        return with_default_targets(config, self.backend.config.model_type)

    def check_tenant_config(self, config: Any) -> frozenset[str]:
        hf = self.backend.hf_model()
        self.check_config(config, [n for n, _ in hf.named_modules() if n])
        if config.target_modules != "all-linear":
            outside = sorted(n for n, _ in hf.named_modules()
                             if n and n not in self.layers and matches(config, n)
                             and not any(n.startswith(s + ".") for s in self.layers))
            if outside:
                raise ValueError(f"The tenant's target_modules reach {outside[:3]} ({len(outside)} layers) which "
                                 f"hold no slot; the slots cover target_modules={self.slot_config.target_modules!r}.")
        return self.targets_of(config)

    def activate_tenant(self, tenant: LoraTenant) -> None:
        spec = self.spec_for(tenant.adapter_name, tenant.tenant_config)
        self.specs[tenant.adapter_name] = spec
        self.configs[tenant.adapter_name] = tenant.tenant_config
        self.zero_unused_ranks(spec)
        self.unused[tenant.adapter_name] = self._unused_views(spec)

    def reset_slot(self, tenant: LoraTenant) -> None:
        self.reset(tenant.adapter_name)
        self.specs.pop(tenant.adapter_name, None)
        self.configs.pop(tenant.adapter_name, None)
        self.unused.pop(tenant.adapter_name, None)

    def seed_slot(self, slot: str, seed: int) -> None:
        self.seeded_init(self.specs[slot], seed)

    def read_tenant_config(self, directory: Path) -> LoraConfig:
        from twinkle_hf.multi_lora.tenant_io import read_tenant_config

        return read_tenant_config(directory)

    def load_slot(self, slot: str, directory: Path) -> None:
        from twinkle_hf.multi_lora.tenant_io import load_tenant

        load_tenant(self, self.specs[slot], directory)

    # ------------------------------------------------------- adapters part
    def routed(self, routes: Sequence[Route]) -> Any:
        """Each route's rows through its tenant's slot (the whole batch for a route without rows)."""
        return self.route([SlotRoute(self.specs[r.group.name], *((None, None) if r.rows is None
                                                                 else (r.rows.start, r.rows.stop)))
                           for r in routes])

    def reference(self, routes: Sequence[Route]) -> Any:
        """The reference policy is the shared base: a route with no tenant adds no LoRA."""
        return self.route([])

    @torch.no_grad()
    def after_step(self, group: OptimizerGroup) -> None:
        """Re-zero the ranks and layers the tenant does not train, whatever the optimizer did (zero gradients
        keep them at zero under AdamW, Muon or SGD, so this only guards against other optimizers)."""
        views = self.unused[group.name]
        if views:
            torch._foreach_zero_(views)

    def _unused_views(self, spec: TenantSpec) -> list[torch.Tensor]:
        """Views of the slot's unused ranks and untargeted layers (sharded slots: none, re-zeroing would
        all-gather every step)."""
        views = []
        for name in self.layers:
            a, b = self.pair(name, spec.slot)
            if is_sharded(a):
                return []
            if name not in spec.targets:
                views += [a.data, b.data]
            elif spec.r < a.shape[0]:
                views += [a.data[spec.r:], b.data[:, spec.r:]]
        return views

    def describe(self, group: OptimizerGroup) -> list[str]:
        spec = self.specs[group.name]
        return [f"    lora: r={spec.r} scaling={spec.scaling:g} layers={len(spec.targets)} (slot {spec.slot})"]

    def state_dict(self, group: OptimizerGroup) -> dict[str, torch.Tensor]:
        from twinkle_hf.multi_lora.tenant_io import tenant_state_dict

        return tenant_state_dict(self, self.specs[group.name])

    def write(self, group: OptimizerGroup, state: dict[str, torch.Tensor], directory: Path) -> None:
        self.files_writer(group, state)(directory)

    def files_writer(self, group: OptimizerGroup, state: dict[str, torch.Tensor]) -> Callable[[Path], None]:
        """What :meth:`write` writes, bound now: a background write still runs after the tenant's release."""
        from twinkle_hf.model.weights import write_adapter

        return functools.partial(write_adapter, state, copy.deepcopy(self.configs[group.name]),
                                 base_model_path=portable_id(self.backend.model_id))

    def load(self, group: OptimizerGroup, directory: Path) -> None:
        from twinkle_hf.multi_lora.tenant_io import config_fits, load_tenant, read_tenant_config

        spec = self.specs[group.name]
        saved = read_tenant_config(directory)
        config_fits(saved, self.configs[group.name], self.targets_of(saved), spec.targets)
        load_tenant(self, spec, directory)

    # -------------------------------------------------------------------- weights
    def pair(self, layer: str, slot: str) -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
        module = self.layers[layer]
        return module.lora_A[slot].weight, module.lora_B[slot].weight

    def snapshot(self, slot: str) -> None:
        """Remember the slot's freshly initialised weights (on the CPU), for resets."""
        self.initial[slot] = {name: tuple(full(p).detach().cpu().clone() for p in self.pair(name, slot))
                              for name in self.layers}

    @torch.no_grad()
    def reset(self, slot: str) -> None:
        """Slot weights back to the snapshot, gradients dropped."""
        for name, (a0, b0) in self.initial[slot].items():
            a, b = self.pair(name, slot)
            assign(a, a0)
            assign(b, b0)
            a.grad = b.grad = None

    @torch.no_grad()
    def zero_unused_ranks(self, spec: TenantSpec, after_step: bool = False) -> None:
        """Ranks ``>= r`` (and layers the tenant does not target) hold zeros: exactly an r-rank adapter.

        After a step this only re-asserts what zero gradients already keep; sharded (FSDP2) slots skip
        that (it would all-gather every step).
        """
        for name in self.layers:
            a, b = self.pair(name, spec.slot)
            if not is_sharded(a):
                spec.zero_unused(name, a, b)
            elif not after_step:
                new_a, new_b = full(a).clone(), full(b).clone()
                spec.zero_unused(name, new_a, new_b)
                assign(a, new_a)
                assign(b, new_b)

    @torch.no_grad()
    def seeded_init(self, spec: TenantSpec, seed: int) -> None:
        """Re-initialise the tenant's LoRA from ``seed`` as peft does for an ``r``-rank adapter.

        lora_A[:r] gets peft's kaiming-uniform init (a=sqrt(5)) drawn from a generator seeded with
        ``seed`` layer by layer in slot order, lora_B zeros; so the init depends on the seed and the
        tenant's config only, not on which slot it got or on max_r.
        """
        generator = torch.Generator().manual_seed(int(seed))
        for name in self.layers:
            if name not in spec.targets:
                continue
            a, b = self.pair(name, spec.slot)
            init = torch.empty(spec.r, a.shape[1], dtype=torch.float32)
            torch.nn.init.kaiming_uniform_(init, a=math.sqrt(5), generator=generator)
            new_a = torch.zeros(a.shape, dtype=a.dtype)
            new_a[:spec.r] = init
            assign(a, new_a)
            assign(b, torch.zeros(b.shape, dtype=b.dtype))

    def parameters(self, group: OptimizerGroup) -> list[torch.nn.Parameter]:
        """What the tenant of ``group``'s slot trains."""
        return self.spec_parameters(self.specs[group.name])

    def spec_parameters(self, spec: TenantSpec) -> list[torch.nn.Parameter]:
        """lora_A/lora_B of the spec's slot on the layers it targets."""
        return [p for name in self.layers if name in spec.targets for p in self.pair(name, spec.slot)]

    # ------------------------------------------------------------------- configs
    def targets_of(self, config: LoraConfig) -> frozenset[str]:
        """Slot layers ``config`` targets (``'all-linear'``: every slot layer), minus ``exclude_modules``."""
        if config.target_modules == "all-linear":
            config = copy.copy(config)
            config.target_modules = set(self.layers)
        return frozenset(name for name in self.layers if matches(config, name))

    def spec_for(self, slot: str, config: LoraConfig) -> TenantSpec:
        return TenantSpec.from_config(slot, config, self.targets_of(config))

    @staticmethod
    def check_config(config: Any, all_modules: Sequence[str]) -> None:
        """Reject what the slots cannot honour, naming the field and the fix."""
        if not isinstance(config, LoraConfig):
            raise TypeError(f"A tenant needs a peft LoraConfig, got {type(config).__name__}.")
        for field_name, allowed in _UNSUPPORTED.items():
            if getattr(config, field_name, allowed) != allowed:
                raise ValueError(f"LoraConfig.{field_name}={getattr(config, field_name)!r} is not supported by "
                                 f"multi-LoRA slots; use {field_name}={allowed!r}.")
        if config.rank_pattern or config.alpha_pattern:
            raise ValueError("LoraConfig rank_pattern/alpha_pattern are not supported by multi-LoRA slots; use one r "
                             "and lora_alpha for every layer.")
        targets = config.target_modules
        if targets is None:
            raise ValueError("The tenant LoraConfig needs target_modules (a list of names, a regex or 'all-linear').")
        if isinstance(targets, (set, list, tuple)):
            missing = sorted(t for t in targets if not any(n == t or n.endswith("." + t) for n in all_modules))
            if missing:
                raise ValueError(f"LoRA target_modules {missing} do not exist in this model; pick among the slots' "
                                 "layers.")

    # ------------------------------------------------------------------- forward
    @contextmanager
    def route(self, routes: Sequence[SlotRoute]) -> Iterator[None]:
        previous, self.routes = self.routes, list(routes)
        try:
            yield
        finally:
            self.routes = previous

    def _forward_hook(self, name: str) -> Any:
        def hook(module: LoraLayer, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
            if self.routes is None:
                raise RuntimeError(f"LoRA layer {name!r} ran outside a tenant route: run the model through the "
                                   "MultiLoraTransformersModel API (forward/forward_backward with adapter_name=).")
            x = args[0]
            if len(self.routes) == 1 and self.routes[0].start is None:  # one tenant for the whole batch
                spec = self.routes[0].spec
                return output if name not in spec.targets else output + self._delta(module, spec, x).to(output.dtype)
            delta = self._grouped(module, self.routes, name, x, output.shape[0])
            return output if delta is None else output + delta.to(output.dtype)

        return hook

    @staticmethod
    def _delta(module: LoraLayer, spec: TenantSpec, x: torch.Tensor) -> torch.Tensor:
        a = module.lora_A[spec.slot].weight[:spec.r]
        b = module.lora_B[spec.slot].weight[:, :spec.r]
        if not torch.is_autocast_enabled(x.device.type):
            x = x.to(a.dtype)
        if spec.dropout > 0:
            x = F.dropout(x, spec.dropout, training=module.training)
        return F.linear(F.linear(x, a), b) * spec.scaling
