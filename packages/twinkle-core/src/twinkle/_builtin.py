"""twinkle-core's own components, registered through the same hooks as any third-party plugin."""

from __future__ import annotations

from twinkle.hookspecs import hookimpl

_TORCH_OPTIMIZERS = (
    "Adadelta", "Adafactor", "Adagrad", "Adam", "Adamax", "AdamW", "ASGD", "LBFGS",
    "Muon", "NAdam", "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam",
)
_TORCH_SCHEDULERS = (
    "ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
    "ExponentialLR", "LambdaLR", "LinearLR", "MultiplicativeLR", "MultiStepLR", "OneCycleLR",
    "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR",
)


@hookimpl
def register_optimizers():
    return {name: f"torch.optim:{name}" for name in _TORCH_OPTIMIZERS}


@hookimpl
def register_lr_schedulers():
    specs = {name: f"torch.optim.lr_scheduler:{name}" for name in _TORCH_SCHEDULERS}
    specs["CosineWarmupScheduler"] = "twinkle.lr_scheduler:CosineWarmupScheduler"
    specs["LinearWarmupScheduler"] = "twinkle.lr_scheduler:LinearWarmupScheduler"
    return specs


@hookimpl
def register_losses():
    return {"CrossEntropyLoss": "twinkle.loss:CrossEntropyLoss"}


@hookimpl
def register_platforms():
    return {"cpu": "twinkle.platform:CPUPlatform", "cuda": "twinkle.platform:CUDAPlatform"}
