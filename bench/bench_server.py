"""twinkle serve under K concurrent tinker clients: batched multi-tenant steps vs time-shared steps.

For K = 1, 2, 4 clients (one API session and one LoRA tenant each) every client runs the same loop
through the real ``tinker`` client: ``forward_backward`` (cross_entropy on ``--rows`` datums of
``--length`` tokens) + ``optim_step``, waiting for both, ``--steps`` times after one warm-up step.
Two servers run side by side on the same model, one with ``--server.batching`` (queued steps of
several tenants run as one ``forward_backward_multi``) and one without (one tenant per step); the
runs alternate between them ``--repeats`` times and the median is kept, so a change of machine
load hits both alike. Reports total tokens/s, the batched/time-shared ratio and p50/p95 of the
client-side step latency (submit to result of a forward_backward + optim_step), as JSON. Not a
test: nothing asserts.

The base model is a ~10M-parameter Qwen2-style model with random weights written to a temporary
directory (``--model`` takes any other model id, e.g. ``twinkle://tiny-qwen``).

    python bench/bench_server.py [--steps 4] [--repeats 2] [--rows 4] [--length 64] [--ks 1,2,4] [--model PATH]

``--fairness`` measures the scheduler instead, on one server with default options but its slots
(``--slots``, default max K + 1, so that paging does not mix into the measure): K = 1, 4, 16
training clients, each with its own API key, run the same loop while one more key (the hostile
one) keeps sampling ``--hostile-samples`` x 120 tokens per request. Reported per K: total training
tokens/s, p50/p95 step latency of the training clients under the hostile sampler and alone (the
same loop without it, in the same run), the hostile key's sampled tokens/s, and Jain's fairness
index of the training keys' tokens/s, ``(sum x)^2 / (n * sum x^2)`` (1 = equal shares).

    python bench/bench_server.py --fairness [--steps 4] [--ks 1,4,16] [--model twinkle://tiny-qwen]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def write_model(directory: Path) -> str:
    """A ~10M-parameter Qwen2-style model with random weights, saved like a hub checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=8192, max_position_embeddings=1024,
                         tie_word_embeddings=False, pad_token_id=0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(directory))
    return str(directory)


def start(model: str, work: Path, keys_file: Path, batching: bool, tenants: int) -> tuple[subprocess.Popen, str]:
    work.mkdir(parents=True, exist_ok=True)
    info = work / "server.json"
    info.unlink(missing_ok=True)
    log = (work / f"server-{'batched' if batching else 'time_shared'}.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "twinkle.cli.main", "serve", "--server.port", "0",
                             "--server.work-dir", str(work), "--server.api-keys-file", str(keys_file),
                             "--model.model-id", model, "--server.max-tenants", str(tenants),
                             "--server.max-rank", "8", f"--server.{'' if batching else 'no-'}batching",
                             "--server.metrics-log-s", "0"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not info.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start:\n{Path(log.name).read_text()[-3000:]}")
        time.sleep(0.3)
    import httpx

    url = json.loads(info.read_text())["url"]
    while True:
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)


def datums(seed: int, rows: int, length: int, vocab: int = 8000) -> list:
    import numpy as np
    from tinker import types

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        ids = rng.integers(3, vocab, length + 1).tolist()
        out.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                               loss_fn_inputs={"target_tokens": ids[1:], "weights": [0.0] * 4 + [1.0] * (length - 4)}))
    return out


def run_k(url: str, key: str, base_model: str, k: int, steps: int, rows: int, length: int) -> dict:
    import numpy as np
    import tinker
    from tinker import types

    services = [tinker.ServiceClient(base_url=url, api_key=key) for _ in range(k)]
    clients = [s.create_lora_training_client(base_model=base_model, rank=8, seed=i).result()
               for i, s in enumerate(services)]
    data = [datums(i, rows, length) for i in range(k)]
    adam = types.AdamParams(learning_rate=1e-4)
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(k + 1)

    def loop(i: int) -> None:
        timed_step(clients[i], data[i], adam)  # warm-up
        barrier.wait()
        mine = [timed_step(clients[i], data[i], adam) for _ in range(steps)]
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(k)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    for service in services:
        service.close("success").result()
    tokens = k * steps * rows * length
    return {"tokens_per_s": tokens / seconds, "seconds": seconds,
            "step_latency_p50_s": float(np.percentile(latencies, 50)),
            "step_latency_p95_s": float(np.percentile(latencies, 95))}


def timed_step(client: Any, data: list, adam: Any) -> float:
    """Seconds of one forward_backward + optim_step, both submitted before waiting (as the cookbook does)."""
    t0 = time.perf_counter()
    fwd = client.forward_backward(data, "cross_entropy")
    opt = client.optim_step(adam)
    fwd.result()
    opt.result()
    return time.perf_counter() - t0


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when every value is equal, 1/n when one takes everything."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 1.0


def train_keys(url: str, keys: list[str], base_model: str, steps: int, rows: int, length: int) -> dict:
    """One training client per key, all at once; per-key tokens/s and every step's latency."""
    import numpy as np
    import tinker
    from tinker import types

    services = [tinker.ServiceClient(base_url=url, api_key=key) for key in keys]
    clients = [s.create_lora_training_client(base_model=base_model, rank=8, seed=i).result()
               for i, s in enumerate(services)]
    vocab = len(clients[0].get_tokenizer())
    data = [datums(i, rows, length, vocab) for i in range(len(keys))]
    adam = types.AdamParams(learning_rate=1e-4)
    latencies: list[float] = []
    rates = [0.0] * len(keys)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(keys))

    def loop(i: int) -> None:
        try:
            timed_step(clients[i], data[i], adam)  # warm-up
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
            barrier.abort()
            return
        barrier.wait()
        t0 = time.perf_counter()
        mine = [timed_step(clients[i], data[i], adam) for _ in range(steps)]
        rates[i] = steps * rows * length / (time.perf_counter() - t0)
        latencies.extend(mine)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(keys))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for service in services:
        service.close("success").result()
    if errors:
        raise errors[0]
    return {"tokens_per_s": sum(rates), "per_key_tokens_per_s": rates,
            "step_latency_p50_s": float(np.percentile(latencies, 50)),
            "step_latency_p95_s": float(np.percentile(latencies, 95))}


def fairness(args: argparse.Namespace) -> dict:
    """K training keys beside one hostile sampling key (see the module docstring)."""
    import httpx
    import tinker
    from tinker import types

    from twinkle_server.auth import add_key

    ks = [int(k) for k in args.ks.split(",")]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-fairness-") as tmp:
        root = Path(tmp)
        keys_file = root / "keys.txt"
        keys = [add_key(keys_file, f"trainer{i}") for i in range(max(ks))]
        hostile_key = add_key(keys_file, "hostile")
        proc, url = start(args.model, root / "server", keys_file, True, args.slots or max(ks) + 1)
        base_model = tinker.RestClient(base_url=url, api_key=hostile_key).get_server_capabilities().result() \
            .supported_models[0].model_name
        try:
            for k in ks:
                alone = train_keys(url, keys[:k], base_model, args.steps, args.rows, args.length)
                service = tinker.ServiceClient(base_url=url, api_key=hostile_key)
                sampler = service.create_sampling_client(base_model=base_model).result()
                stop = threading.Event()
                sampled = [0]

                def hostile(stop: Any = stop, sampler: Any = sampler, sampled: list = sampled) -> None:
                    with httpx.Client(base_url=url, headers={"X-API-Key": hostile_key}, timeout=600) as http:
                        while not stop.is_set():
                            request_id = http.post("/api/v1/asample", json={
                                "sampling_session_id": sampler._sampling_session_id, "seq_id": 1,
                                "num_samples": args.hostile_samples,
                                "prompt": types.ModelInput.from_ints([5, 6, 7]).model_dump(mode="json"),
                                "sampling_params": {"max_tokens": 120, "stop": []}}).json()["request_id"]
                            while not stop.is_set():
                                answer = http.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()
                                if answer.get("type") != "try_again":
                                    sampled[0] += 120 * args.hostile_samples if "sequences" in answer else 0
                                    break
                            else:
                                http.post("/api/v1/cancel_future", json={"request_id": request_id})

                thread = threading.Thread(target=hostile)
                thread.start()
                time.sleep(1.0)
                t0 = time.perf_counter()
                contended = train_keys(url, keys[:k], base_model, args.steps, args.rows, args.length)
                seconds = time.perf_counter() - t0
                stop.set()
                thread.join()
                service.close("success").result()
                results[f"K={k}"] = {
                    "training_tokens_per_s": contended["tokens_per_s"],
                    "step_latency_p50_s": contended["step_latency_p50_s"],
                    "step_latency_p95_s": contended["step_latency_p95_s"],
                    "alone_step_latency_p50_s": alone["step_latency_p50_s"],
                    "alone_step_latency_p95_s": alone["step_latency_p95_s"],
                    "p50_ratio_under_hostile": contended["step_latency_p50_s"] / alone["step_latency_p50_s"],
                    "hostile_sampled_tokens_per_s_finished_requests": sampled[0] / seconds,
                    "jain_index_training_keys": jain(contended["per_key_tokens_per_s"]),
                }
                print(json.dumps({f"K={k}": results[f"K={k}"]}), file=sys.stderr, flush=True)
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    return results


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--ks", default="1,2,4")
    parser.add_argument("--model", default=None)
    parser.add_argument("--fairness", action="store_true", help="the fairness bench instead (see above)")
    parser.add_argument("--hostile-samples", type=int, default=256)
    parser.add_argument("--slots", type=int, default=0, help="--fairness: server.max_tenants (0: max K + 1, so "
                                                              "paging does not mix into the measure)")
    args = parser.parse_args()
    if args.fairness:
        args.model = args.model or "twinkle://tiny-qwen"
        args.ks = args.ks if args.ks != "1,2,4" else "1,4,16"
        results = fairness(args)
        print(json.dumps({"bench": "twinkle serve: K training keys beside one hostile sampling key",
                          "model": args.model, "rows": args.rows, "length": args.length, "steps": args.steps,
                          "hostile": f"{args.hostile_samples} samples x 120 tokens per request, back to back",
                          "machine": platform.machine(), "cpus": os.cpu_count(),
                          "load_average": os.getloadavg()[0], "results": results}, indent=2))
        return
    ks = [int(k) for k in args.ks.split(",")]
    from twinkle_server.auth import add_key

    modes = {"batched": True, "time_shared": False}
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        root = Path(tmp)
        model = args.model or write_model(root / "model")
        keys_file = root / "keys.txt"
        key = add_key(keys_file, "bench")
        servers = {mode: start(model, root / mode, keys_file, batching, max(ks)) for mode, batching in modes.items()}
        runs: dict[str, dict[str, list[dict]]] = {f"K={k}": {mode: [] for mode in modes} for k in ks}
        try:
            for k in ks:
                for _ in range(args.repeats):
                    for mode, (_, url) in servers.items():
                        runs[f"K={k}"][mode].append(run_k(url, key, model, k, args.steps, args.rows, args.length))
        finally:
            for proc, _ in servers.values():
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
    results = {}
    for name, by_mode in runs.items():
        row = {mode: {field: float(np.median([r[field] for r in reps])) for field in reps[0]}
               for mode, reps in by_mode.items()}
        row["tokens_per_s_ratio_batched_vs_time_shared"] = (row["batched"]["tokens_per_s"]
                                                            / row["time_shared"]["tokens_per_s"])
        results[name] = row
    print(json.dumps({"bench": "twinkle serve: batched multi-tenant vs time-shared steps",
                      "model": args.model or "qwen2 ~10M params (random weights)", "rows": args.rows,
                      "length": args.length, "steps": args.steps, "repeats (median)": args.repeats,
                      "machine": platform.machine(), "cpus": os.cpu_count(),
                      "load_average": os.getloadavg()[0], "results": results}, indent=2))


if __name__ == "__main__":
    main()
