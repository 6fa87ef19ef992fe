"""Small but working components; the test suite calls each one to prove it resolved for real."""

import torch

from twinkle.model import TwinkleModel
from twinkle.patch import Patch
from twinkle.platform import Platform


class ExampleModel(TwinkleModel):
    """Declares the protocol only; tests check the class resolves and subclasses TwinkleModel."""


class ExampleL1Loss:
    def __call__(self, inputs, outputs, **kwargs):
        return (outputs["logits"] - inputs["target"]).abs().mean()


class ExampleMetric:
    def __init__(self):
        self.total = 0.0

    def update(self, value):
        self.total += float(value)

    def compute(self):
        return {"example_total": self.total}


class ExampleSGD(torch.optim.SGD):
    """Plain SGD under another name."""


class ExampleConstantLR(torch.optim.lr_scheduler.ConstantLR):
    """ConstantLR under another name."""


class ExampleTemplate:
    def encode(self, row):
        return {"input_ids": [ord(c) for c in row["text"]]}


class ExamplePreprocessor:
    def __call__(self, row):
        return {"messages": [{"role": "user", "content": row["q"]}, {"role": "assistant", "content": row["a"]}]}


class ExampleProcessor:
    def __call__(self, rows):
        return {"input_ids": torch.tensor([r["input_ids"] for r in rows])}


class ExamplePatch(Patch):
    def apply(self, module):
        module.example_patched = True


def example_rms_norm(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class ExamplePrecision:
    name = "example_fp4"


class ExamplePlatform(Platform):
    name = "example_device"
    device_type = "cpu"
    priority = -1

    @classmethod
    def is_available(cls):
        return False


def example_hello(argv):
    """The example plugin's ``twinkle example-hello`` command: echoes its arguments, exits 3 on ``--fail``."""
    print("hello from twinkle-example-plugin:", " ".join(argv))
    return 3 if "--fail" in argv else 0
