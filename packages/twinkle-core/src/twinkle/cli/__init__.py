"""twinkle's command line: the ``twinkle`` console script (``twinkle.cli.main``) and the ``CLI`` argument object.

``from twinkle.cli import CLI; args = CLI.from_args()`` gives a training script its grouped options
(see docs/cli.md). Importing this package loads only the standard library.
"""

from twinkle.cli.args import CLI, CLIError, CLIHelpRequested
from twinkle.cli.args_groups import (
    DatasetArgs,
    InfraArgs,
    LoraArgs,
    ModelArgs,
    OptimizerArgs,
    SchedulerArgs,
    TemplateArgs,
    TrainingArgs,
)

__all__ = [
    "CLI",
    "CLIError",
    "CLIHelpRequested",
    "DatasetArgs",
    "InfraArgs",
    "LoraArgs",
    "ModelArgs",
    "OptimizerArgs",
    "SchedulerArgs",
    "TemplateArgs",
    "TrainingArgs",
]
