"""Values every part of twinkle must agree on, in one place."""

#: Label of a token that is not trained on (PyTorch's ``cross_entropy`` default, the HF convention).
IGNORE_INDEX = -100

#: Batch key of next-token targets already aligned with the logits (``shift_labels[:, t]`` is what
#: ``logits[:, t]`` predicts), transformers' name for them. Sequence parallelism shifts the labels over the
#: whole row before each rank keeps its part, since a part's last target is the next part's first token.
SHIFT_LABELS = "shift_labels"

#: What a template does with a row longer than ``max_length`` (``Dataset.set_template``, the configs).
TRUNCATION_STRATEGIES = ("raise", "left", "right", "delete")
