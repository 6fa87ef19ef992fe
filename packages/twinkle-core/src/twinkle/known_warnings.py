"""Warnings our dependencies raise about twinkle's own use of them, silenced where we know they do not apply.

:func:`silence` installs one narrow filter per entry of :data:`KNOWN` (message and category); the
entries marked ``embedded_only`` only when the model is one of twinkle's embedded ``twinkle://``
models. :func:`twinkle.launch.build_model` (the Trainer, ``twinkle train``, ``twinkle serve``)
calls it; a script building a model itself calls it once (the cookbooks do).

Where each is raised (the model layer's line that triggers it), so it can be fixed at the source:

- transformers' ``is_gradient_checkpointing`` FutureWarning: peft's ``PeftModel.__init__`` reads the
  deprecated property, when ``twinkle_hf/model/adapters.py`` calls ``get_peft_model``. The call is
  peft's, not ours; nothing to act on until peft reads ``is_activation_checkpointing``.
- peft's "``tie_word_embeddings=True`` and a tied layer is part of the adapter": the same
  ``get_peft_model`` call, on the embedded tiny model, whose LoRA adapts ``lm_head`` on purpose (a
  random-init head must learn). A merged export unties the head first
  (:mod:`twinkle.trainer.export`), so merging does not change the embeddings.
- peft's "Setting ``save_embedding_layers`` to ``True``": ``get_peft_model_state_dict`` called from
  ``twinkle_hf/model/weights.py`` (``adapter_state_dict``) when a checkpoint is saved; on the
  embedded model the tied embedding is saved with the adapter, as a random-init base needs.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Known:
    message: str  #: a regular expression matching the start of the warning's text
    category: type[Warning]
    embedded_only: bool  #: silenced only for twinkle's embedded (twinkle://) models


KNOWN = (
    Known(r"`is_gradient_checkpointing` is deprecated", FutureWarning, embedded_only=False),
    Known(r"Model has `tie_word_embeddings=True` and a tied layer is part of the adapter", UserWarning,
          embedded_only=True),
    Known(r"Setting `save_embedding_layers` to `True` as embedding layers found", UserWarning, embedded_only=True),
)


def silence(model_id: str | None = None) -> None:
    """Filter the :data:`KNOWN` warnings; the embedded-model ones only when ``model_id`` is a ``twinkle://`` id."""
    embedded = isinstance(model_id, str) and model_id.startswith("twinkle://")
    for known in KNOWN:
        if embedded or not known.embedded_only:
            warnings.filterwarnings("ignore", message=known.message, category=known.category)
