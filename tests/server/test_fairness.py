"""A heavy key cannot starve a light one: while one key samples 4096 x 120 tokens, another key's training steps
stay within 3x of their solo latency (issue 23, case 3).

The bound is a ratio within one run: the trainer's step latency is measured alone, then under the
sampler, then alone again, and the contended median is compared with the median of all solo steps.
Measuring both in the same minute makes the ratio robust to the load of a shared machine (both
sides slow down together); medians ignore a step that met a hiccup; and a round over the bound is
measured again, up to 3 rounds, the best counting: a load spike of this shared machine can inflate
one round (seen once: 11x, then 1.8x alone), while a starved trainer fails every round. Expected: each of the two
requests of a step waits at most one sampling slice (``server.slice_ms``, 100 ms), while a solo
step on this machine takes about as long as a slice or more, so the ratio lands near 1.5-2; 3 is the
issue's bound. Before the fix the trainer waited for the whole 4096-sample request (minutes).
"""

from __future__ import annotations

import statistics
import time

from server_proc import BASE_MODEL
from server_testing import sft_datums
from tinker import types

ADAM = types.AdamParams(learning_rate=1e-3)
#: Rounds at most: a round whose ratio is over the bound is measured again (a load spike of the machine inflates
#: one round; a starved trainer fails every round, by minutes).
ROUNDS = 3


def _step_latencies(training, datums, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        started = time.monotonic()
        fwd = training.forward_backward(datums, "cross_entropy")
        opt = training.optim_step(ADAM)
        fwd.result()
        opt.result()
        out.append(time.monotonic() - started)
    return out


def test_a_heavy_sampler_does_not_starve_another_keys_training(server, alice, bob):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=1).result()
    datums = sft_datums(training.get_tokenizer())
    sampler = bob.create_sampling_client(base_model=BASE_MODEL).result()
    _step_latencies(training, datums, 1)  # warm-up
    ratios = []
    for _ in range(ROUNDS):
        ratio, queued = _round(server, training, datums, sampler)
        ratios.append(ratio)
        if ratio <= 3.0:
            break
    print(f"ratios per round: {', '.join(f'{r:.2f}' for r in ratios)} ({queued} of 16 requests still queued)")
    assert min(ratios) <= 3.0


def _round(server, training, datums, sampler) -> tuple[float, int]:
    """Solo steps, steps beside 4096 x 120 samples (then cancelled), solo steps again: contended / solo medians."""
    solo = _step_latencies(training, datums, 3)
    hostile = []
    with server.http("bob") as http:
        for _ in range(16):  # 16 x 256 = 4096 samples of 120 tokens, at the per-request cap
            answer = http.post("/api/v1/asample", json={
                "sampling_session_id": sampler._sampling_session_id, "num_samples": 256, "seq_id": 1,
                "prompt": types.ModelInput.from_ints([5, 6, 7]).model_dump(mode="json"),
                "sampling_params": {"max_tokens": 120, "temperature": 1.0, "stop": []}})
            assert answer.status_code == 200, answer.text
            hostile.append(answer.json()["request_id"])
        time.sleep(1.0)  # the sampler is running
        contended = _step_latencies(training, datums, 4)
        metrics = http.get("/metrics").text
        queued = next((int(line.split()[1]) for line in metrics.splitlines()
                       if line.startswith('twinkle_queue_depth{kind="sample"}')), 0)
        assert queued > 0  # still sampling: the trainer really ran beside it
        for request_id in hostile:
            assert http.post("/api/v1/cancel_future", json={"request_id": request_id}).status_code == 200
        answer = http.post("/api/v1/retrieve_future", json={"request_id": hostile[-1]}).json()
        assert "cancelled" in answer["error"]
    solo += _step_latencies(training, datums, 3)
    ratio = statistics.median(contended) / statistics.median(solo)
    print(f"trainer step latency: solo median {statistics.median(solo):.3f}s, under the 4096x120 sampler "
          f"{statistics.median(contended):.3f}s, ratio {ratio:.2f}")
    return ratio, queued
