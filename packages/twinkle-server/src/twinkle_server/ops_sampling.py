"""Sampling sessions and ``asample``, served by a twinkle Sampler (``TorchSampler``) on the tenants' LoRA.

A sampling session names fixed weights: a sampler checkpoint (``create_sampling_client(model_path=)``),
a snapshot taken by ``save_weights_and_get_sampling_client`` (saved as a hidden adapter directory),
or the base model. A sample runs on the live tenant while its weights are still those of the
snapshot (no optimizer step or load since); otherwise the saved adapter is loaded into a spare slot
for the request and released after.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from twinkle_server.errors import ApiError, not_found
from twinkle_server.futures import Result
from twinkle_server.wire import Sampled, sample_json, sample_response


class SamplingOps:
    """Sampling half of :class:`twinkle_server.service.Service`."""

    def _require_sampler(self) -> None:
        if self.engine.sampler is None:
            raise ApiError(400, f"this server cannot sample: {self.engine.no_sampler or 'no sampler was built'}.")

    def snapshot_dir(self, model_id: str, sampler_id: str) -> Path:
        return self.dirs.kind_dir(model_id, "sampler_weights").parent / "sampling_sessions" / sampler_id

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
        """``save_weights_and_get_sampling_client``: an ephemeral snapshot of the tenant's adapter."""
        self._require_sampler()
        row = self.model_row(owner, request.model_id)
        sampler_id = f"{row['session_id']}:sample:{secrets.token_hex(6)}"
        directory = self.snapshot_dir(request.model_id, sampler_id.replace(":", "~"))

        def run() -> Any:
            self.engine.save(request.model_id, directory, optimizer=False)
            self.store.add_sampler(sampler_id, owner, row["session_id"], request.model_id, None,
                                   self.config.base_model_name, self.engine.weights_version.get(request.model_id))
            return Result({"type": "save_weights_for_sampler", "sampling_session_id": sampler_id})

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
        unsupported = [name for name, off in (("topk_prompt_logprobs", 0), ("topk_sample_logprobs", 0),
                                              ("target_prompt_logprobs", None), ("prompt_alt_tokens_k", 0))
                       if getattr(request, name) not in (off, None)]
        if unsupported:
            raise ApiError(400, f"{', '.join(unsupported)} are not supported by this server; sample without them "
                                "(prompt_logprobs and prompt_logprobs_last_n are).")
        try:
            prompt = request.prompt.to_ints()
        except ValueError:
            raise ApiError(400, "only text prompts (ModelInput.from_ints) can be sampled here.") from None
        if not prompt or request.num_samples < 1:
            raise ApiError(400, "sample needs a non-empty prompt and num_samples >= 1.")
        want_logprobs = bool(request.prompt_logprobs)
        last_n = request.prompt_logprobs_last_n
        if last_n is not None and not 1 <= last_n <= len(prompt) - 1:
            raise ApiError(400, f"prompt_logprobs_last_n={last_n} must be in 1..len(prompt)-1 = {len(prompt) - 1}.")
        directory = self._sampler_weights(row)

        def run() -> Result:
            with self.engine.adapter_for(row["model_id"], row["weights_version"], directory) as adapter:
                sequences, scored = self.engine.sample(adapter, prompt, request.sampling_params,
                                                       request.num_samples, want_logprobs)
            if scored is not None and last_n is not None:
                scored = [None] * (len(scored) - last_n) + scored[-last_n:]
            sampled = [Sampled(list(s.tokens), list(s.logprobs), s.stop_reason) for s in sequences]
            return Result(sample_json(sampled, scored), sample_response(sampled, scored), persist=False)

        tokens = len(prompt) * request.num_samples
        record = self.submit(owner, "sample", None, None, run=run, tokens=tokens)
        return self.untyped(record, sample_sequence_ids=[f"{record.id}:{i}" for i in range(request.num_samples)])

    def _sampler_weights(self, row: dict[str, Any]) -> Path | None:
        """The adapter directory a sampling session samples from (None: the base model)."""
        if row["model_path"] is not None:
            return self.checkpoint_dir(row["owner"], row["model_path"], need_optimizer=False)[1]
        if row["model_id"] is not None:
            return self.snapshot_dir(row["model_id"], row["id"].replace(":", "~"))
        return None
