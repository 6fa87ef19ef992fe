"""Registers one component of every kind, all defined in twinkle_example.components."""

from twinkle.hookspecs import hookimpl

_MODULE = "twinkle_example.components"


@hookimpl
def register_models():
    return {"ExampleModel": f"{_MODULE}:ExampleModel"}


@hookimpl
def register_losses():
    return {"ExampleL1Loss": f"{_MODULE}:ExampleL1Loss"}


@hookimpl
def register_metrics():
    return {"ExampleMetric": f"{_MODULE}:ExampleMetric"}


@hookimpl
def register_optimizers():
    return {"ExampleSGD": f"{_MODULE}:ExampleSGD"}


@hookimpl
def register_lr_schedulers():
    return {"ExampleConstantLR": f"{_MODULE}:ExampleConstantLR"}


@hookimpl
def register_templates():
    return {"ExampleTemplate": f"{_MODULE}:ExampleTemplate"}


@hookimpl
def register_preprocessors():
    return {"ExamplePreprocessor": f"{_MODULE}:ExamplePreprocessor"}


@hookimpl
def register_processors():
    return {"ExampleProcessor": f"{_MODULE}:ExampleProcessor"}


@hookimpl
def register_patches():
    return {"ExamplePatch": f"{_MODULE}:ExamplePatch"}


@hookimpl
def register_kernels():
    return {"example_rms_norm": f"{_MODULE}:example_rms_norm"}


@hookimpl
def register_precisions():
    return {"example_fp4": f"{_MODULE}:ExamplePrecision"}


@hookimpl
def register_platforms():
    return {"example_device": f"{_MODULE}:ExamplePlatform"}


@hookimpl
def register_commands():
    from twinkle.registry import ComponentSpec

    return {"example-hello": ComponentSpec(f"{_MODULE}:example_hello", description="say hello (example plugin)")}
