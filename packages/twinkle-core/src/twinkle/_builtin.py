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


#: RL and preference losses, by Tinker's names where Tinker defines the loss (see docs/rl.md)
_RL_LOSSES = {
    "cross_entropy": "TokenCrossEntropy", "importance_sampling": "ImportanceSamplingLoss", "ppo": "PPOLoss",
    "cispo": "CISPOLoss", "dro": "DROLoss", "gspo": "GSPOLoss", "grpo": "GRPOLoss", "dr_grpo": "DrGRPOLoss",
    "bnpo": "BNPOLoss", "dpo": "DPOLoss", "ipo": "IPOLoss", "simpo": "SimPOLoss", "orpo": "ORPOLoss",
    "sapo": "SAPOLoss", "cpo": "CPOLoss",
}


@hookimpl
def register_losses():
    specs = {name: f"twinkle.loss:{name}" for name in ("CrossEntropyLoss", "InfoNCELoss", "ChunkedCrossEntropyLoss",
                                                      "MSELoss", "GKDLoss")}
    specs.update({name: f"twinkle.loss:{cls}" for name, cls in _RL_LOSSES.items()})
    return specs


@hookimpl
def register_advantages():
    return {name: f"twinkle.advantage:{name}" for name in ("grpo", "rloo", "reward_minus_baseline")}


@hookimpl
def register_rewards():
    return {name: f"twinkle.reward:{name}" for name in ("exact_match", "numeric_match", "format_match")}


@hookimpl
def register_platforms():
    return {"cpu": "twinkle.platform:CPUPlatform", "cuda": "twinkle.platform:CUDAPlatform"}


@hookimpl
def register_metrics():
    return {"LossMetric": "twinkle.metric:LossMetric", "TokenAccuracy": "twinkle.metric:TokenAccuracy"}


@hookimpl
def register_templates():
    return {
        name: f"twinkle.template.{module}:{name}"
        for module, name in (
            ("base", "Template"), ("chatml", "ChatMLTemplate"), ("qwen", "Qwen2_5Template"),
            ("qwen", "Qwen3Template"), ("qwen", "Qwen3_5Template"), ("llama", "Llama3Template"),
            ("deepseek", "DeepSeekR1Template"), ("deepseek", "DeepSeekV4Template"),
            ("deepseek_v4", "DeepseekV4Template"), ("others", "MistralTemplate"),
            ("others", "YiTemplate"), ("others", "GLM4Template"), ("others", "InternLM2Template"),
            ("vl", "VLTemplate"), ("vl", "Qwen2VLTemplate"), ("vl", "Qwen2_5VLTemplate"), ("vl", "Qwen3VLTemplate"),
            ("vl", "Qwen3_5VLTemplate"), ("internvl", "InternVL2_5Template"),
        )
    }


@hookimpl
def register_preprocessors():
    return {
        "SelfCognitionProcessor": "twinkle.preprocessor.self_cognition:SelfCognitionProcessor",
        "AlpacaProcessor": "twinkle.preprocessor.alpaca:AlpacaProcessor",
        "MessagesProcessor": "twinkle.preprocessor.conversation:MessagesProcessor",
        "CompetitionMathProcessor": "twinkle.preprocessor.competition_math:CompetitionMathProcessor",
        "CompetitionMathGRPOProcessor": "twinkle.preprocessor.competition_math:CompetitionMathGRPOProcessor",
    }


@hookimpl
def register_patches():
    return {"GradientCheckpointing": "twinkle.patch:GradientCheckpointing"}


@hookimpl
def register_processors():
    return {"InputProcessor": "twinkle.processor.input_processor:InputProcessor"}


@hookimpl
def register_kernels():
    # torch reference choices, the last link of every chain (see twinkle/kernel/torch_choices.py)
    ops = ("rms_norm", "swiglu", "rotary_embedding", "attention", "cross_entropy", "fused_linear_cross_entropy")
    return {f"torch.{op}": f"twinkle.kernel.torch_choices:TORCH_{op.upper()}" for op in ops}


@hookimpl
def register_probers():
    return {name: f"twinkle.trainer.probes:{name}" for name in ("AccProber", "TimeProber")}
