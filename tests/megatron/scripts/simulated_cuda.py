"""MegatronModel's CUDA code path run on CPU, in its own process: a *simulation*, not a GPU run.

megatron-core's DDP, DistributedOptimizer, forward-backward schedule, finalize_model_grads and
distributed checkpointing are pure PyTorch apart from hard-coded ``device='cuda'`` allocations and a
``param.type()`` check. This script redirects those to the CPU (``simulate_cuda``), tells the model
it is on CUDA, and runs the scenarios of tests/gpu/run_megatron.sh (fp32 weights; one bf16 LoRA run
built as on a GPU). It proves twinkle's wiring (drivers, schedule, accumulation, dist-checkpoint
resume, per-tenant DDP chunks and optimizers) against megatron's real classes; kernels, NCCL and
bf16/fp8 numerics still need the GPU script.

argv: <qwen2 dir> <output json>. Module-level imports stay stdlib-only: megatron's checkpoint writer starts a
helper process that re-imports this file.
"""

from __future__ import annotations

import functools
import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def simulate_cuda() -> None:
    """Send ``device='cuda'`` allocations to the CPU and make CPU tensors pass megatron's CUDA type checks."""
    import torch

    def cpu_device(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return fn(*args, **kwargs)

        return wrapper

    for name in ("tensor", "zeros", "empty", "ones", "full"):
        setattr(torch, name, cpu_device(getattr(torch, name)))
    plain_type = torch.Tensor.type

    def cuda_type(self, *args, **kwargs):
        kind = plain_type(self, *args, **kwargs)
        return kind.replace("torch.", "torch.cuda.", 1) if not args and not kwargs and "cuda" not in kind else kind

    torch.Tensor.type = cuda_type
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.cuda.synchronize = lambda *args, **kwargs: None


def model(path: Path, **kwargs):
    from megatron_testing import megatron_model

    m = megatron_model(path, **kwargs)
    m.backend.device_type = "cuda"  # from here on MegatronModel takes its GPU code path
    return m


def run(m, start: int, steps: int, micro: int = 2, adapter: str | None = None) -> list[float]:
    from megatron_testing import make_batch

    losses = []
    for step in range(start, start + steps):
        losses.append(float(m.forward_backward(inputs=make_batch(seed=100 + step), num_microbatches=micro,
                                               adapter_name=adapter)))
        m.clip_grad_and_step(1.0, adapter_name=adapter)
    return losses


def fresh(path: Path):
    m = model(path)
    # Adam with eps = 1: Lipschitz in the gradient, so the test's in-process reference stays within a derived bound
    m.set_optimizer("default", lr=5e-3, weight_decay=0.01, adam_eps=1.0)
    m.set_lr_scheduler("default", lr_warmup_steps=1, lr_decay_steps=6, lr_decay_style="linear")
    return m


def main() -> None:
    from megatron_testing import make_batch

    simulate_cuda()
    path, out = Path(sys.argv[1]), Path(sys.argv[2])
    report = {}

    single = fresh(path)
    report["optimizer_kind"] = single.optimizer_group["default"].optimizer.kind
    report["model_wrapped"] = type(single.backend.group_module(single.optimizer_group["default"])).__name__
    data = make_batch(seed=7)
    losses, norms = [], []
    for micro in (1, 2, 4):
        m = fresh(path)
        losses.append(float(m.forward_backward(inputs=data, num_microbatches=micro)))
        norms.append(m.clip_grad_norm(1.0))
    report["losses_by_microbatches"], report["norms_by_microbatches"] = losses, norms

    report["straight"] = run(fresh(path), 0, 4)
    first = fresh(path)
    head = run(first, 0, 2)
    checkpoint = Path(first.save("step-2", output_dir=str(out.parent), save_optimizer=True))
    report["checkpoint_files"] = sorted(p.name for p in checkpoint.iterdir())
    resumed = fresh(checkpoint)
    report["progress"] = resumed.resume_from_checkpoint(str(checkpoint))
    report["resumed"] = head + run(resumed, 2, 2)

    from peft import LoraConfig

    lora = model(path)
    lora.add_adapter_to_model("a", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    lora.set_optimizer("default", lr=2e-2, adapter_name="a")
    fixed = make_batch(seed=3)
    report["lora_losses"] = []
    for _ in range(6):
        report["lora_losses"].append(float(lora.forward_backward(inputs=fixed, num_microbatches=2)))
        lora.clip_grad_and_step(1.0)
    report.update(several_tenants(path))
    report.update(tenants_batched(path))
    report.update(bf16_lora(path))
    report.update(lm_head_lora(path, out))
    out.write_text(json.dumps(report))


def lm_head_lora(path: Path, out: Path) -> dict:
    """LoRA on lm_head on the GPU path: megatron's DDP and DistributedOptimizer over the output layer's LoRA, and a
    dist-checkpoint save and resume of its optimizer state (GPTModel's sharded_state_dict reads the wrapped output
    layer's weight under its own name, ``output_layer.weight``)."""
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "lm_head"])

    def fresh_lora():
        m = model(path)
        m.add_adapter_to_model("a", config)
        m.set_optimizer("default", lr=2e-2, adapter_name="a")
        return m

    straight = run(fresh_lora(), 0, 4, adapter="a")
    first = fresh_lora()
    head = run(first, 0, 2, adapter="a")
    checkpoint = Path(first.save("lm-head-step-2", output_dir=str(out.parent), adapter_name="a", save_optimizer=True))
    driver = first.optimizer_group["a"].optimizer
    output_lora = {id(p) for n, p in first.gpt.named_parameters() if n.startswith("output_layer.lora_")}
    resumed = fresh_lora()
    resumed.resume_from_checkpoint(str(checkpoint), adapter_name="a")
    return {"lm_head": {"straight": straight, "resumed": head + run(resumed, 2, 2, adapter="a"),
                        "files": sorted(p.name for p in checkpoint.iterdir()),
                        "output_b_max": float(first.gpt.output_layer.lora_B["a"].abs().max()),
                        "kind": driver.kind, "output_lora_in_chunk": len(output_lora) == 2 and output_lora <= {
                            id(p) for p in driver.chunks[0].params_with_grad}}}


def several_tenants(path: Path, mixed_precision: str = "no") -> dict:
    """Two tenants with the 'default' (distributed) optimizer, trained interleaved, against each trained alone;
    then one is released and its slot re-acquired: the newcomer trains like a fresh tenant.

    Also the GPU tier's scenario (tests/gpu/test_megatron_gpu.py runs it on a real GPU)."""
    import hashlib

    from megatron_testing import make_batch
    from peft import LoraConfig

    from twinkle.model import MultiLoraMegatronModel

    configs = {"t1": LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
               "t2": LoraConfig(r=8, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])}

    def multi():
        m = MultiLoraMegatronModel(model_id=str(path), mixed_precision=mixed_precision, max_loras=2, max_r=8)
        m.backend.device_type = "cuda"  # simulated: take the GPU code path (already so on a GPU)
        for tenant, config in configs.items():
            m.multi_lora.acquire_lora(tenant, config)
            m.set_optimizer("default", lr=2e-2, adapter_name=tenant)
        return m

    def step(m, tenant, seed):
        loss = float(m.forward_backward(inputs=make_batch(seed=seed), adapter_name=tenant, num_microbatches=2))
        m.clip_grad_and_step(1.0, adapter_name=tenant)
        return loss

    def digest(m, tenant):
        h = hashlib.sha256()
        for _, p in m.backend.adapters.named_parameters(m._group(tenant)):
            h.update(p.detach().float().numpy().tobytes())
        return h.hexdigest()

    seeds = {"t1": [40, 41, 42], "t2": [50, 51, 52]}
    alone = {}
    for tenant in configs:
        m = multi()
        alone[tenant] = [step(m, tenant, s) for s in seeds[tenant]]
    m = multi()
    interleaved, untouched = {"t1": [], "t2": []}, []
    for i in range(3):
        for tenant, other in (("t1", "t2"), ("t2", "t1")):
            before = digest(m, other)
            interleaved[tenant].append(step(m, tenant, seeds[tenant][i]))
            untouched.append(digest(m, other) == before)
    drivers = [m._group(t).optimizer for t in configs]
    slot = {t: m._group(t).name for t in configs}
    bookkeeping = {
        "kinds": [d.kind for d in drivers],
        "own_chunks": drivers[0].chunks[0] is not drivers[1].chunks[0],
        "chunk_params_are_the_slot": all(
            {id(p) for p in d.chunks[0].params_with_grad}
            == {id(p) for p in m.backend.adapters.ddp_parameters(m._group(t))} for d, t in zip(drivers, configs)),
    }
    m.multi_lora.release_lora("t1")
    m.multi_lora.acquire_lora("t3", configs["t1"])
    m.set_optimizer("default", lr=2e-2, adapter_name="t3")
    bookkeeping["reacquired_slot"] = m._group("t3").name == slot["t1"]
    bookkeeping["reused_chunk"] = m._group("t3").optimizer.chunks[0] is drivers[0].chunks[0]
    reacquired = [step(m, "t3", s) for s in seeds["t1"]]
    return {"tenants_alone": alone, "tenants_interleaved": interleaved, "tenants_untouched": untouched,
            "tenants_reacquired": reacquired, "tenants_bookkeeping": bookkeeping}


def tenants_batched(path: Path) -> dict:
    """forward_backward_multi on the GPU path (the tenants' rows stacked, each slot with its own Megatron-DDP chunk
    and distributed optimizer) against each tenant's own forward_backward through megatron's schedule."""
    from megatron_testing import make_batch
    from peft import LoraConfig

    from twinkle.model import MultiLoraMegatronModel

    configs = {"t1": LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
               "t2": LoraConfig(r=8, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])}

    def multi():
        m = MultiLoraMegatronModel(model_id=str(path), mixed_precision="no", max_loras=2, max_r=8)
        m.backend.device_type = "cuda"  # simulated: take the GPU code path
        for i, (tenant, config) in enumerate(configs.items()):
            m.acquire_lora(tenant, config, seed=i)
            # Adam with eps = 1 (the DistributedOptimizer takes no SGD): Lipschitz in the gradient, the weights follow
            m.set_optimizer("default", lr=2e-2, adapter_name=tenant, adam_eps=1.0)
        return m

    fused, sequential = multi(), multi()
    losses, norms = {"fused": [], "sequential": []}, {"fused": [], "sequential": []}
    for step in range(2):  # B starts at zero: the second step trains A too
        batches = {"t1": make_batch(seed=80 + step, rows=2), "t2": make_batch(seed=90 + step, rows=3, length=9)}
        losses["fused"].append({t: float(v) for t, v in fused.forward_backward_multi(batches).items()})
        losses["sequential"].append({t: float(sequential.forward_backward(b, adapter_name=t))
                                     for t, b in batches.items()})
        for name, m in (("fused", fused), ("sequential", sequential)):
            norms[name].append({t: m.clip_grad_norm(1.0, adapter_name=t) for t in configs})
            for t in configs:
                m.clip_grad_and_step(1.0, adapter_name=t)
    diff = 0.0
    for t in configs:
        a, b = fused.get_state_dict(adapter_name=t), sequential.get_state_dict(adapter_name=t)
        diff = max([diff] + [float((a[k] - b[k]).abs().max()) for k in b])
    return {"batched": {"losses": losses, "norms": norms, "state_max_diff": diff,
                        "steps": [fused._group(t).cur_step for t in configs]}}


def bf16_lora(path: Path) -> dict:
    """LoRA with mixed_precision='bf16' as on a GPU: frozen weights bf16, the optimizer's master copies fp32."""
    import torch
    from megatron_testing import make_batch
    from peft import LoraConfig

    from twinkle_megatron import build

    build._param_dtype = lambda mixed_precision, device_type: torch.bfloat16  # what build does on CUDA
    m = model(path, mixed_precision="bf16")
    m.add_adapter_to_model("a", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    m.set_optimizer("default", lr=2e-2, adapter_name="a")
    driver = m.optimizer_group["a"].optimizer
    lora = [p for n, p in m.gpt.named_parameters() if ".lora_" in n]
    frozen = [p for n, p in m.gpt.named_parameters() if ".lora_" not in n]
    masters = [p for g in driver.optimizer.optimizer.param_groups for p in g["params"]]
    fixed = make_batch(seed=3)
    losses = []
    for _ in range(6):
        losses.append(float(m.forward_backward(inputs=fixed, num_microbatches=2)))
        m.clip_grad_and_step(1.0)
    return {"bf16": {
        "frozen_dtypes": sorted({str(p.dtype) for p in frozen}),
        "lora_model_dtypes": sorted({str(p.dtype) for p in lora}),
        "master_dtypes": sorted({str(p.dtype) for p in masters}),
        "master_numel": sum(p.numel() for p in masters), "lora_numel": sum(p.numel() for p in lora),
        "grad_buffer_params_are_lora": {id(p) for p in driver.chunks[0].params_with_grad} == {id(p) for p in lora},
        "losses": losses,
    }}


if __name__ == "__main__":  # megatron's checkpoint writer starts worker processes that re-import this file
    main()
