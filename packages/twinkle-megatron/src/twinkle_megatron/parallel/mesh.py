"""twinkle's DeviceMesh -> megatron-core's parallel sizes, checked against the model before anything is built.

twinkle lays ranks out row-major over ``(pp, dp, fsdp, cp, tp)`` (tp fastest) and megatron-core
over its order ``tp-cp-ep-dp-pp`` (tp fastest): with ``fsdp_size=1`` the two coincide, so
megatron's TP/CP/DP/PP groups are exactly ``mesh.group_ranks('tp'|'cp'|'dp'|'pp', rank)``, and the
expert-parallel groups (carved out of dp x cp in both) match ``DeviceMesh.coords(r)['ep']``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinkle.mesh import DeviceMesh
from twinkle_megatron.bridge.config import ModelArgs
from twinkle_megatron.errors import MegatronConfigError

#: megatron-core's default rank order, the one twinkle's mesh reproduces.
MEGATRON_ORDER = "tp-cp-ep-dp-pp"


@dataclass(frozen=True)
class ParallelSizes:
    """The sizes handed to ``parallel_state.initialize_model_parallel``."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    sequence_parallel: bool = False

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def initialize_kwargs(self) -> dict[str, Any]:
        return dict(tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp,
                    context_parallel_size=self.cp, expert_model_parallel_size=self.ep, order=MEGATRON_ORDER)


def check_vpp(mesh: DeviceMesh) -> None:
    if mesh.vpp_size is not None and mesh.vpp_size > 1:
        raise MegatronConfigError(
            f"DeviceMesh(vpp_size={mesh.vpp_size}) asks for virtual pipeline parallelism, which MegatronModel does "
            "not support (interleaved schedules are known to be broken in this release). Remove vpp_size; "
            "pp_size alone gives a plain 1F1B pipeline."
        )


def parallel_sizes(mesh: DeviceMesh) -> ParallelSizes:
    """The megatron sizes of a mesh, or a MegatronConfigError naming the dimension megatron cannot map."""
    check_vpp(mesh)
    if mesh.fsdp_size > 1:
        raise MegatronConfigError(
            f"DeviceMesh(fsdp_size={mesh.fsdp_size}) cannot be mapped onto megatron-core: it has no FSDP dimension "
            "in its process groups. Use dp_size instead; the default MegatronDistributedOptimizer already shards "
            "optimizer state and gradients across data-parallel ranks (ZeRO-1/2 style)."
        )
    return ParallelSizes(tp=mesh.tp_size, pp=mesh.pp_size, cp=mesh.cp_size, ep=mesh.ep_size, dp=mesh.dp_size,
                         sequence_parallel=mesh.sequence_parallel)


def check_model_fits(sizes: ParallelSizes, args: ModelArgs) -> None:
    """Every split megatron would do must be even; say which one is not."""
    problems = []
    if args.num_attention_heads % sizes.tp:
        problems.append(f"num_attention_heads={args.num_attention_heads} by tp_size={sizes.tp}")
    if args.num_query_groups % sizes.tp:
        problems.append(f"num_key_value_heads={args.num_query_groups} by tp_size={sizes.tp}")
    if args.ffn_hidden_size % sizes.tp:
        problems.append(f"intermediate_size={args.ffn_hidden_size} by tp_size={sizes.tp}")
    if args.num_layers % sizes.pp:
        problems.append(f"num_hidden_layers={args.num_layers} by pp_size={sizes.pp}")
    if sizes.ep > 1 and not args.num_experts:
        raise MegatronConfigError(f"ep_size={sizes.ep} needs a mixture-of-experts model; "
                                  f"{args.family.architecture} is dense. Use ep_size=1.")
    if args.num_experts and args.num_experts % sizes.ep:
        problems.append(f"num_experts={args.num_experts} by ep_size={sizes.ep}")
    if problems:
        raise MegatronConfigError("The DeviceMesh does not divide this model evenly: " + "; ".join(problems)
                                  + ". Choose sizes that divide these numbers.")


def check_runtime_support(sizes: ParallelSizes, device_type: str, te_ok: bool) -> None:
    """Parallel features that need CUDA or Transformer Engine, refused up front with the reason."""
    if device_type != "cuda":
        gpu_only = [f"{name}={value}" for name, value in (("pp_size", sizes.pp), ("cp_size", sizes.cp),
                                                          ("ep_size", sizes.ep)) if value > 1]
        if sizes.sequence_parallel:
            gpu_only.append("sequence_parallel=True")
        if gpu_only:
            raise MegatronConfigError(
                f"{', '.join(gpu_only)} needs CUDA: megatron-core's pipeline schedules, context-parallel attention "
                "and token dispatchers allocate on the GPU. On CPU, MegatronModel runs tp_size/dp_size only."
            )
    if sizes.ep > 1 and sizes.tp > 1 and not sizes.sequence_parallel:
        raise MegatronConfigError(f"ep_size={sizes.ep} with tp_size={sizes.tp} needs sequence_parallel=True "
                                  "(megatron-core's MoE layers require it when experts and tensors are both split).")
    if sizes.cp > 1 and not te_ok:
        raise MegatronConfigError(f"cp_size={sizes.cp} needs Transformer Engine's attention: "
                                  "pip install 'twinkle-megatron[fp8]' (transformer-engine[pytorch]).")
    if sizes.sequence_parallel and not te_ok:
        raise MegatronConfigError("sequence_parallel=True needs Transformer Engine (or Apex) norms in megatron-core: "
                                  "pip install 'twinkle-megatron[fp8]'.")
