"""The hot path stays asynchronous: ``forward_backward`` never reads a device tensor back to the host.

On a GPU, ``.item()``, ``float()``, ``.tolist()``, ``bool()`` of a tensor, boolean-mask indexing or
``nonzero`` on a device tensor waits for every queued kernel. One such read per micro-batch before
``backward`` stalls the accelerator at each step (issue 12: one host read per optimizer step, for logging,
is the budget). On CPU nothing waits, so this test simulates the accelerator: a torch function mode
marks as "device" the model's parameters and what ``twinkle.model.inputs.to_device`` returns (copied,
as a real move would), follows that mark through every operation, and records each host read of a
marked tensor made by twinkle's own code. transformers' reads (its sdpa mask check) are not ours and
are not counted; the collated batch on the host may be read freely (the token-range and pair checks do).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import pytest
import torch
from hf_testing import make_batch, make_model
from peft import LoraConfig
from rl_testing import make_pairs, make_rollouts
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

import twinkle
import twinkle.model.inputs as core_inputs
import twinkle_hf
import twinkle_hf.model.backend as hf_backend
from twinkle.loss.token_inputs import TokenOutputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multi_lora"))
from ml_testing import lora, make_multi  # noqa: E402

T = torch.Tensor
#: Calls that make the host wait for the device when given a device tensor.
HOST_READS = {T.item, T.tolist, T.__bool__, T.__float__, T.__int__, T.__index__, T.nonzero, torch.nonzero,
              T.masked_select, torch.masked_select, T.unique, torch.unique, T.numpy, T.cpu, T.bincount,
              torch.bincount, T.repeat_interleave, torch.repeat_interleave}
OURS = tuple(str(Path(m.__file__).parent) for m in (twinkle, twinkle_hf))
TORCH = str(Path(torch.__file__).parent)


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class DeviceReads(TorchFunctionMode):
    """Records ``(call, file:line, function)`` for each host read of a device-marked tensor by twinkle's code."""

    def __init__(self, device_tensors: list[torch.Tensor], everyone: bool = False) -> None:
        super().__init__()
        self.everyone = everyone  # also the reads of transformers, peft and torch (the host-sync budget)
        self.on_device = WeakIdKeyDictionary({t: True for t in device_tensors})
        self.reads: list[tuple[str, str, str]] = []

    def mark(self, tree):
        for t in _tensors(tree):
            self.on_device[t] = True
        return tree

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        marked = any(t in self.on_device for t in _tensors((args, kwargs)))
        mask_index = func is T.__getitem__ and any(t.dtype == torch.bool for t in _tensors(args[1:]))
        if marked and (func in HOST_READS or mask_index):
            self._record(func)
        out = func(*args, **kwargs)
        return self.mark(out) if marked else out

    def _record(self, func) -> None:
        if self.everyone:
            frame = next((f for f in reversed(traceback.extract_stack()[:-2]) if not f.filename.startswith(TORCH)),
                         traceback.extract_stack()[-3])
            self.reads.append((func.__name__, f"{Path(frame.filename).name}:{frame.lineno}", frame.name))
            return
        for frame in reversed(traceback.extract_stack()[:-2]):  # [-2:]: this and __torch_function__
            if frame.filename.startswith(TORCH):
                continue  # inside torch itself: the read is its caller's
            if frame.filename.startswith(OURS):
                self.reads.append((func.__name__, f"{Path(frame.filename).name}:{frame.lineno}", frame.name))
            return


@pytest.fixture
def spy(monkeypatch):
    """A function running ``step()`` under :class:`DeviceReads` with the moves to the device marked."""

    def run(model, step, everyone=False):
        mode = DeviceReads(list(model.model.parameters()) + list(model.model.buffers()), everyone)

        def to_device(batch, device):  # a real move returns new tensors: copy, then mark them
            moved = {k: v.clone() if isinstance(v, torch.Tensor) else v
                     for k, v in core_inputs.to_device(batch, device).items()}
            return mode.mark(moved)

        monkeypatch.setattr(hf_backend, "to_device", to_device)  # where every HF batch moves to the device
        with mode:
            step()
        return mode.reads

    return run


def test_the_spy_sees_the_reads_it_must_forbid(spy):
    """The detector itself: twinkle code reading device tensors is caught; reading host tensors is not."""
    model = make_model(seed=0)
    param = next(model.model.parameters())
    segments = torch.tensor([[0, 0, 1, -1]])
    reads = {}

    def step():  # per_sample hands results back after a step: it reads its tensors on purpose
        reads["host"] = TokenOutputs({"x": torch.ones(1, 4)}, segments).per_sample()
        reads["device"] = TokenOutputs({"x": param.reshape(-1)[:4].reshape(1, 4) * 1}, segments).per_sample()

    found = spy(model, step)
    assert len(reads["host"]) == len(reads["device"]) == 2
    assert found and {where.split(":")[0] for _, where, _ in found} == {"token_inputs.py"}
    assert {"__getitem__", "cpu"} <= {call for call, _, _ in found}, found


LOSSES = [("cross_entropy", {}, lambda seed: make_batch(seed)),
          # the torch chunked kernel (no liger here): fixed chunks over all positions, ignored rows masked
          ("LigerFusedLinearCrossEntropyLoss", {"chunk_size": 5}, lambda seed: make_batch(seed)),
          ("grpo", {"beta": 0.2}, make_rollouts),  # the KL term adds a reference forward (adapters off)
          ("gspo", {}, make_rollouts),
          ("dr_grpo", {"max_tokens": 8}, make_rollouts),
          ("dpo", {"beta": 0.5}, make_pairs),
          ("orpo", {}, make_pairs)]


@pytest.mark.parametrize("loss,options,make", LOSSES, ids=[c[0] for c in LOSSES])
def test_forward_backward_reads_nothing_back_from_the_device(spy, loss, options, make):
    model = make_model(seed=0)
    model.add_adapter_to_model("policy", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.set_loss(loss, adapter_name="policy", **options)
    model.set_optimizer("SGD", lr=0.1, adapter_name="policy")
    results = []

    def step():
        for micro in range(2):
            results.append(model.forward_backward(inputs=make(micro), adapter_name="policy",
                                                  gradient_accumulation_steps=2))

    assert spy(model, step) == []
    assert all(torch.isfinite(torch.tensor(float(r))) for r in results)  # the lazy losses read fine afterwards
    model.clip_grad_and_step(adapter_name="policy")


def test_several_tenants_in_one_step_read_nothing_back_from_the_device(spy):
    model = make_multi(seed=0)
    for tenant, loss in (("t1", "grpo"), ("t2", "gspo")):
        model.multi_lora.acquire_lora(tenant, lora(r=4, alpha=8, targets=("q_proj", "v_proj")))
        model.set_loss(loss, adapter_name=tenant, beta=0.1)
        model.set_optimizer("SGD", lr=0.1, adapter_name=tenant)
    losses = {}

    def step():
        losses.update(model.forward_backward_multi({"t1": make_rollouts(1), "t2": make_rollouts(2)}))

    assert spy(model, step) == []
    assert set(losses) == {"t1", "t2"}


def test_the_fused_linear_ce_kernel_reads_nothing_back_from_the_device():
    """Issue 22, defect 4: the chunk loop was sized by ``valid.nonzero()``, one sync per micro-batch."""
    from twinkle.kernel import fused_linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(30, 8, generator=g).requires_grad_()
    weight = (torch.randn(40, 8, generator=g) * 0.3).requires_grad_()
    bias = torch.zeros(40).requires_grad_()
    labels = torch.randint(0, 40, (30,), generator=g)
    labels[::3] = -100
    mode = DeviceReads([hidden, weight, bias, labels])
    with mode:
        out = fused_linear_cross_entropy(hidden, weight, labels, bias, chunk_size=7)
        out.loss.backward()
    assert mode.reads == []
    assert int(out.num_tokens) == 20 and hidden.grad[::3].abs().sum() == 0  # ignored rows: masked, no gradient


def _batch(vocab: int = 50) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 6), generator=g)
    labels = ids.clone()
    labels[:, :2] = -100
    return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def test_the_batch_check_reads_a_device_batch_back_once():
    """Issue 22, defect 4: boolean-mask indexing of the labels was a second sync (its size depends on the data)."""
    from twinkle.model.inputs import check_batch

    batch = _batch()
    mode = DeviceReads(list(batch.values()))
    with mode:
        check_batch(batch, vocab_size=50)
    assert [call for call, _, _ in mode.reads] == ["tolist"], mode.reads
    bad = _batch()
    bad["labels"][0, 3] = 50
    with pytest.raises(ValueError, match="labels holds 50"):
        check_batch(bad, vocab_size=50)
    assert check_batch(_batch(), vocab_size=50)["labels"].device.type == "cpu"  # a host batch stays on the host


def test_host_sync_budget_of_a_default_training_step(spy):
    """The budget of the default path (HF model, LoRA, default loss, padding-free rows of one length), counting
    every caller's reads (transformers', peft's and torch's too): 0 per micro-batch (the losses stay device
    tensors until the caller reads them) and 1 per optimizer step, the grad norm handed back for logging.
    transformers' sdpa mask builder read an all-ones ``attention_mask`` back (``.all()``), and with
    ``position_ids`` but no mask its packed-sequence check does the same: such inputs say only what the model
    assumes without them, so they are left out.
    """
    model = make_model(seed=0)
    model.add_adapter_to_model("policy", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.set_optimizer("SGD", lr=0.1, adapter_name="policy")
    results = []

    def micro_batches():
        for micro in range(2):
            g = torch.Generator().manual_seed(micro)
            ids = torch.randint(3, 100, (4, 12), generator=g)
            labels = ids.clone()
            labels[:, :3] = -100
            batch = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids),
                     "position_ids": torch.arange(12).expand(4, 12).clone()}  # as the DataLoader collates them
            results.append(model.forward_backward(inputs=batch, adapter_name="policy",
                                                  gradient_accumulation_steps=2))

    assert spy(model, micro_batches, everyone=True) == []
    step_reads = spy(model, lambda: results.append(model.clip_grad_and_step(adapter_name="policy")), everyone=True)
    assert [(call, function) for call, _, function in step_reads] == [("__float__", "clip")], step_reads
