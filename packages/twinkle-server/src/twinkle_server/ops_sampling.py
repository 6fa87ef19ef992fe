"""Sampling sessions and ``asample``, served by a twinkle Sampler (``TorchSampler``) on the tenants' LoRA.

A sampling session names fixed weights: a sampler checkpoint (``create_sampling_client(model_path=)``),
a snapshot taken by ``save_weights_and_get_sampling_client`` (saved as the sampler checkpoint
``sampler_weights/snapshot-...``: listed, deletable, expiring after ``server.snapshot_ttl_s``), or
the base model. A sample runs on the live tenant while its weights are still those of the
snapshot (the same weights version: no optimizer step or load since, and no restart); otherwise
the saved adapter gets a slot of its own, like any model (see :mod:`twinkle_server.paging`).

A request is capped (``server.max_num_samples``; prompt + ``max_tokens`` within ``server.max_length``)
and runs in slices: a few sequences for a few tokens at a time, sized to take about
``server.slice_ms``, so the scheduler can give other keys the worker in between. A sequence is
continued from its prompt + what it has generated; stop strings that span two slices are found
on the whole sequence. With a ``seed`` each slice draws from ``(seed, slice number)``, so the same
request gives the same samples.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from twinkle_server.errors import ApiError, not_found
from twinkle_server.futures import Result
from twinkle_server.ops_checkpoints import expiry
from twinkle_server.paging import SlotsBusy
from twinkle_server.paths import CheckpointRef
from twinkle_server.scheduler import RETRY
from twinkle_server.wire import Sampled, WireError, check_token_ids, sample_json, sample_response

#: Sequences sampled together in one slice at most.
SLICE_SEQUENCES = 64
#: New tokens of the first slice (later slices are sized from the time per token measured).
FIRST_SLICE_TOKENS = 8


class SamplingOps:
    """Sampling half of :class:`twinkle_server.service.Service`."""

    def _require_sampler(self) -> None:
        if self.engine.sampler is None:
            raise ApiError(400, f"this server cannot sample: {self.engine.no_sampler or 'no sampler was built'}.")

    def create_sampling_session(self, owner: str, request: Any) -> dict[str, Any]:
        self.session_row(owner, request.session_id)
        sampler_id = f"{request.session_id}:sample:{secrets.token_hex(6)}"
        if request.model_path is not None:
            ref, _ = self.checkpoint_dir(owner, request.model_path, need_optimizer=False)
            self._require_sampler()
            self.store.add_sampler(sampler_id, owner, request.session_id, ref.model_id, request.model_path,
                                   self.config.base_model_name, None)
        else:
            self.check_base_model(request.base_model or self.config.base_model_name)
            self._require_sampler()
            self.store.add_sampler(sampler_id, owner, request.session_id, None, None, self.config.base_model_name,
                                   None)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def snapshot_for_sampler(self, owner: str, request: Any) -> dict[str, Any]:
        """``save_weights_and_get_sampling_client``: a snapshot of the tenant's adapter, a sampler checkpoint."""
        self._require_sampler()
        row = self.model_row(owner, request.model_id)
        sampler_id = f"{row['session_id']}:sample:{secrets.token_hex(6)}"
        ref = CheckpointRef(request.model_id, "sampler_weights", "snapshot-" + sampler_id.rsplit(":", 1)[1])
        directory = self.dirs.directory(ref)
        expires_at = expiry(request.ttl_seconds, self.config.server.snapshot_ttl_s)

        def run() -> Any:
            self.engine.save(request.model_id, directory, optimizer=False)
            self.store.add_checkpoint(ref.model_id, ref.checkpoint_id, owner, sum(
                p.stat().st_size for p in directory.rglob("*") if p.is_file()), None, expires_at)
            self.store.add_sampler(sampler_id, owner, row["session_id"], request.model_id, ref.tinker_path,
                                   self.config.base_model_name, self.engine.weights_version.get(request.model_id))
            return Result({"type": "save_weights_for_sampler", "sampling_session_id": sampler_id,
                           "path": ref.tinker_path})

        return self.untyped(self.submit(owner, "save_weights", request.model_id, request.seq_id, run=run))

    def sampler_info(self, owner: str, sampler_id: str) -> dict[str, Any]:
        row = self.store.sampler(sampler_id, owner)
        if row is None:
            raise not_found("sampler", sampler_id)
        return {"sampler_id": sampler_id, "base_model": row["base_model"], "model_path": row["model_path"]}

    def join_sampling_session(self, owner: str, sampler_id: str) -> dict[str, Any]:
        if self.store.sampler(sampler_id, owner) is None:
            raise not_found("sampler", sampler_id)
        return {"type": "join_sampling_session", "client_counter": self.store.join_sampler(sampler_id)}

    def asample(self, owner: str, request: Any) -> dict[str, Any]:
        self._require_sampler()
        if request.sampling_session_id is None:
            raise ApiError(400, "asample needs a sampling_session_id (create_sampling_client first).")
        row = self.store.sampler(request.sampling_session_id, owner)
        if row is None:
            raise not_found("sampler", request.sampling_session_id)
        self.session_row(owner, row["session_id"])
        unsupported = [name for name, off in (("topk_prompt_logprobs", 0), ("topk_sample_logprobs", 0),
                                              ("target_prompt_logprobs", None), ("prompt_alt_tokens_k", 0))
                       if getattr(request, name) not in (off, None)]
        if unsupported:
            raise ApiError(400, f"{', '.join(unsupported)} are not supported by this server; sample without them "
                                "(prompt_logprobs and prompt_logprobs_last_n are).")
        if any(getattr(chunk, "type", "encoded_text") != "encoded_text" for chunk in request.prompt.chunks):
            raise ApiError(400, "sampling a prompt with image chunks is not supported by this server yet (its "
                                "TorchSampler takes token prompts); training and forward() take images.")
        prompt = request.prompt.to_ints()
        server = self.config.server
        if not prompt:
            raise ApiError(400, "sample needs a non-empty prompt.")
        if not 1 <= request.num_samples <= server.max_num_samples:
            raise ApiError(400, f"num_samples={request.num_samples} is not allowed; this server takes 1.."
                                f"{server.max_num_samples} per request (server.max_num_samples): send several "
                                "requests.")
        try:
            check_token_ids(np.asarray(prompt), self.engine.vocab_size, "prompt")
        except WireError as exc:
            raise ApiError(400, str(exc)) from None
        params = request.sampling_params
        max_tokens = params.max_tokens if params.max_tokens is not None else min(128, server.max_length - len(prompt))
        if max_tokens < 1 or len(prompt) + max_tokens > server.max_length:
            raise ApiError(400, f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) must be at most "
                                f"{server.max_length} tokens (server.max_length), with max_tokens >= 1.")
        if params.seed is not None and not 0 <= params.seed < 2**63:
            raise ApiError(400, f"sampling_params.seed={params.seed} must be in 0..2**63-1.")
        want_logprobs = bool(request.prompt_logprobs)
        last_n = request.prompt_logprobs_last_n
        if last_n is not None and not 1 <= last_n <= len(prompt) - 1:
            raise ApiError(400, f"prompt_logprobs_last_n={last_n} must be in 1..len(prompt)-1 = {len(prompt) - 1}.")
        directory = self._sampler_weights(row)
        try:  # a checkpoint saved again under the same name (overwrite=True) is other weights: another slot
            sampler_key = f"{row['id']}@{directory.stat().st_mtime_ns if directory is not None else 0}"
        except FileNotFoundError:
            raise not_found("sampler weights", row["model_path"]) from None

        def run() -> Iterator[None]:
            return self._sample_slices(sampler_key, row, directory, prompt, params, request.num_samples, max_tokens,
                                       want_logprobs, last_n)

        tokens = len(prompt) * request.num_samples
        record = self.submit(owner, "sample", None, None, run=run, tokens=tokens, session_id=row["session_id"])
        return self.untyped(record, sample_sequence_ids=[f"{record.id}:{i}" for i in range(request.num_samples)])

    def _sample_slices(self, sampler_key: str, row: dict[str, Any], directory: Path | None, prompt: list[int],
                       params: Any, num_samples: int, max_tokens: int, want_logprobs: bool,
                       last_n: int | None) -> Iterator[None]:
        """A generator: each ``next`` runs one slice; its return value is the request's :class:`Result`."""
        target_s = self.config.server.slice_ms / 1000.0
        done: list[Sampled] = []
        seconds_per_token = None  # per sequence-token step of one slice, measured
        last_steps = FIRST_SLICE_TOKENS
        slice_number = 0
        for first in range(0, num_samples, SLICE_SEQUENCES):
            count = min(SLICE_SEQUENCES, num_samples - first)
            rows = [([], []) for _ in range(count)]  # (tokens, logprobs) of each unfinished sequence
            while rows:
                # sized from the last slice's time per token, growing at most 2x a slice (a quiet moment of the
                # machine must not make the next, busier one long)
                steps = FIRST_SLICE_TOKENS if seconds_per_token is None else \
                    max(1, min(int(target_s / max(seconds_per_token, 1e-6)), 2 * last_steps))
                steps = min(steps, max_tokens - len(rows[0][0]))
                seed = None if params.seed is None else (params.seed * 1_000_003 + slice_number) % 2**63
                started = time.monotonic()
                try:
                    with self.engine.adapter_for(sampler_key, row["model_id"], row["weights_version"],
                                                 directory) as adapter:
                        outs = self.engine.sample(adapter, [prompt + r[0] for r in rows], params, steps, seed)
                except SlotsBusy:
                    yield RETRY  # every slot in use: this slice again in a moment
                    continue
                seconds_per_token = (time.monotonic() - started) / steps
                last_steps = steps
                slice_number += 1
                unfinished = []
                for (tokens, logprobs), out in zip(rows, outs):
                    tokens, logprobs = tokens + list(out.tokens), logprobs + list(out.logprobs)
                    cut = self.engine.cut_at_stop_strings(tokens, logprobs, params) if out.stop_reason == "length" \
                        else None
                    if cut is not None:
                        done.append(Sampled(list(cut.tokens), list(cut.logprobs), "stop"))
                    elif out.stop_reason == "stop":
                        done.append(Sampled(tokens, logprobs, "stop"))
                    elif len(tokens) >= max_tokens:
                        done.append(Sampled(tokens, logprobs, "length"))
                    else:
                        unfinished.append((tokens, logprobs))
                rows = unfinished
                yield
        scored = None
        while want_logprobs and scored is None:
            try:
                with self.engine.adapter_for(sampler_key, row["model_id"], row["weights_version"],
                                             directory) as adapter:
                    scored = self.engine.prompt_logprobs(adapter, prompt)
            except SlotsBusy:
                yield RETRY
            if last_n is not None:
                scored = [None] * (len(scored) - last_n) + scored[-last_n:]
        return Result(sample_json(done, scored), sample_response(done, scored), persist=False)

    def _sampler_weights(self, row: dict[str, Any]) -> Path | None:
        """The adapter directory a sampling session samples from (None: the base model)."""
        if row["model_path"] is None:
            return None
        try:
            return self.checkpoint_dir(row["owner"], row["model_path"], need_optimizer=False)[1]
        except ApiError as exc:
            if exc.status == 404:
                raise ApiError(404, f"the weights of sampler {row['id']!r} ({row['model_path']}) were deleted or "
                                    "expired (snapshots live server.snapshot_ttl_s); save weights again "
                                    "(save_weights_and_get_sampling_client).") from None
            raise
