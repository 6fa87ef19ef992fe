"""Per-tenant throughput and latency, queue depth: on ``GET /metrics`` (Prometheus text) and in the log.

A tenant's tokens/s is over a sliding window (``WINDOW_S``) of its forward/backward tokens; step
latency is the time from a request entering the queue to its result (p50/p95 over the last
``LATENCY_SAMPLES`` requests of each kind), so it includes waiting behind other tenants.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from typing import Any

WINDOW_S = 60.0
LATENCY_SAMPLES = 512


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) by linear interpolation, None without values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class Metrics:
    """Counters updated by the worker, read by the HTTP threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.queue_depth = 0
        self.queued: dict[str, int] = {}
        self.started = time.monotonic()
        self._tokens: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._total_tokens: dict[str, int] = defaultdict(int)
        self._latency: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=LATENCY_SAMPLES))
        self._owner: dict[str, str] = {}
        self.requests: dict[str, int] = defaultdict(int)
        self.batched_steps = 0
        self.batched_tenants = 0
        self.slots: Any = dict  # () -> the pager's counts (resident, paged, page_outs, page_ins...)

    def record(self, batch: list[Any], seconds: float) -> None:
        """One executed unit: its requests' tokens and queue-to-result latencies."""
        now = time.monotonic()
        with self._lock:
            if len(batch) > 1:
                self.batched_steps += 1
                self.batched_tenants += len(batch)
            for work in batch:
                self.requests[work.kind] += 1
                self._latency[work.kind].append(now - work.enqueued)
                if work.model_id is not None and work.tokens:
                    self._owner[work.model_id] = work.future.owner
                    self._tokens[work.model_id].append((now, work.tokens))
                    self._total_tokens[work.model_id] += work.tokens

    def tenant_rates(self, owner: str | None = None) -> dict[str, dict[str, float]]:
        """model id -> tokens/s over the window and total tokens (only ``owner``'s when given)."""
        now = time.monotonic()
        out = {}
        with self._lock:
            for model_id, events in self._tokens.items():
                if owner is not None and self._owner.get(model_id) != owner:
                    continue
                while events and now - events[0][0] > WINDOW_S:
                    events.popleft()
                span = min(WINDOW_S, max(now - self.started, 1e-9))
                out[model_id] = {"tokens_per_second": sum(n for _, n in events) / span,
                                 "tokens_total": float(self._total_tokens[model_id])}
        return out

    def latencies(self) -> dict[str, dict[str, float | None]]:
        with self._lock:
            return {kind: {"p50": percentile(list(v), 0.5), "p95": percentile(list(v), 0.95), "count": len(v)}
                    for kind, v in self._latency.items()}

    def snapshot(self, owner: str | None = None) -> dict[str, Any]:
        return {"queue_depth": self.queue_depth, "queued": dict(self.queued), "tenants": self.tenant_rates(owner),
                "slots": dict(self.slots()),
                "latency_s": self.latencies(), "batched_steps": self.batched_steps,
                "batched_tenants": self.batched_tenants, "requests": dict(self.requests)}

    def prometheus(self, owner: str | None = None) -> str:
        """The snapshot in Prometheus' text exposition format."""
        snap = self.snapshot(owner)
        lines = ["# TYPE twinkle_queue_depth gauge", f"twinkle_queue_depth {snap['queue_depth']}",
                 *(f'twinkle_queue_depth{{kind="{kind}"}} {n}' for kind, n in sorted(snap["queued"].items())),
                 "# TYPE twinkle_batched_steps_total counter", f"twinkle_batched_steps_total {snap['batched_steps']}",
                 "# TYPE twinkle_models gauge",
                 *(f'twinkle_models{{where="{k}"}} {v}' for k, v in snap["slots"].items() if not k.startswith("page_")),
                 "# TYPE twinkle_pages_total counter",
                 *(f'twinkle_pages_total{{direction="{k[5:]}"}} {v}' for k, v in snap["slots"].items()
                   if k.startswith("page_")),
                 "# TYPE twinkle_tenant_tokens_per_second gauge"]
        for model_id, rates in snap["tenants"].items():
            lines.append(f'twinkle_tenant_tokens_per_second{{model_id="{model_id}"}} {rates["tokens_per_second"]:.6g}')
        lines.append("# TYPE twinkle_tenant_tokens_total counter")
        for model_id, rates in snap["tenants"].items():
            lines.append(f'twinkle_tenant_tokens_total{{model_id="{model_id}"}} {rates["tokens_total"]:.0f}')
        lines.append("# TYPE twinkle_request_latency_seconds summary")
        for kind, stats in snap["latency_s"].items():
            for q in ("p50", "p95"):
                if stats[q] is not None:
                    quantile = "0.5" if q == "p50" else "0.95"
                    lines.append(f'twinkle_request_latency_seconds{{kind="{kind}",quantile="{quantile}"}} '
                                 f"{stats[q]:.6g}")
            lines.append(f'twinkle_request_latency_seconds_count{{kind="{kind}"}} {stats["count"]}')
        return "\n".join(lines) + "\n"

    def log_line(self) -> str:
        snap = self.snapshot()
        tenants = ", ".join(f"{m}: {r['tokens_per_second']:.0f} tok/s" for m, r in snap["tenants"].items()) or "none"
        step = snap["latency_s"].get("forward_backward", {})
        p50, p95 = step.get("p50"), step.get("p95")
        latency = f"p50 {p50:.3f}s p95 {p95:.3f}s" if p50 is not None else "n/a"
        return f"queue depth {snap['queue_depth']}; forward_backward latency {latency}; tenants: {tenants}"
