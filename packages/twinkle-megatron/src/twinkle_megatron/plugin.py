"""twinkle-megatron's registrations (entry point ``twinkle = megatron``). Specs are lazy strings.

Nothing here imports megatron, torch or Transformer Engine: the fp8 provider is listed only when
TE's PyTorch extension is installed (a ``find_spec`` check); whether TE actually imports is
checked when fp8 is used, with ``except Exception`` (see ``te.py``).
"""

from __future__ import annotations

from twinkle.hookspecs import hookimpl
from twinkle_megatron.te import te_installed


@hookimpl
def register_models():
    return {
        "MegatronModel": "twinkle_megatron.model:MegatronModel",
        "MultiLoraMegatronModel": "twinkle_megatron.model:MultiLoraMegatronModel",
    }


@hookimpl
def register_optimizers():
    return {"MegatronDistributedOptimizer": "twinkle_megatron.optim:MegatronDistributedOptimizer"}


@hookimpl
def register_lr_schedulers():
    return {"OptimizerParamScheduler": "twinkle_megatron.optim:OptimizerParamScheduler"}


@hookimpl
def register_precisions():
    return {"fp8": "twinkle_megatron.fp8:TransformerEngineFP8"} if te_installed() else {}
