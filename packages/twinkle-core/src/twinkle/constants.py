"""Values every part of twinkle must agree on, in one place."""

#: Label of a token that is not trained on (PyTorch's ``cross_entropy`` default, the HF convention).
IGNORE_INDEX = -100

#: What a template does with a row longer than ``max_length`` (``Dataset.set_template``, the configs).
TRUNCATION_STRATEGIES = ("raise", "left", "right", "delete")
