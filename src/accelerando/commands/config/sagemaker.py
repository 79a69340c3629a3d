"""The questions of ``accelerando config`` for an Amazon SageMaker job.

They produce a :class:`~accelerando.commands.config.config_args.SageMakerConfig` that can be saved
and shared; ``accelerando launch`` itself runs on this machine or a cluster and does not submit
SageMaker jobs (it says so when given such a file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accelerando.commands.config.config_args import SageMakerConfig
from accelerando.commands.config.config_utils import DYNAMO_BACKENDS
from accelerando.common.constants import SAGEMAKER_PARALLEL_EC2_INSTANCES, TORCH_DYNAMO_MODES
from accelerando.core.enums_on_demand import ComputeEnvironment

if TYPE_CHECKING:
    from questionary import Question

__all__ = ["DYNAMO_BACKENDS", "SAGEMAKER_PARALLEL_EC2_INSTANCES", "TORCH_DYNAMO_MODES", "get_sagemaker_input"]


def _ask(question: Question) -> Any:
    answer = question.ask()
    if answer is None:
        raise KeyboardInterrupt
    return answer


def get_sagemaker_input() -> SageMakerConfig | None:
    """Ask, in the terminal, for the settings of a SageMaker training job and build the config.

    Returns:
        The config, or ``None`` when the user cancelled (Ctrl-C / Ctrl-D).

    Raises:
        ImportError: questionary is not installed (the message gives the install command).
    """
    try:
        import questionary
    except ImportError as err:
        raise ImportError(
            "The SageMaker questions need questionary. Fix: `pip install questionary`."
        ) from err
    try:
        role = _ask(questionary.text("Name of the IAM role SageMaker runs the job with?"))
        region = _ask(questionary.text("AWS region?", default="us-east-1"))
        kind = _ask(
            questionary.select(
                "Which kind of training?", choices=["NO", "DATA_PARALLEL", "MODEL_PARALLEL"], default="NO"
            )
        )
        parallel = kind != "NO"
        if parallel:
            instance = _ask(
                questionary.select("EC2 instance type?", choices=SAGEMAKER_PARALLEL_EC2_INSTANCES)
            )
            machines = int(_ask(questionary.text("How many machines?", default="1", validate=str.isdigit)))
        else:
            instance = _ask(questionary.text("EC2 instance type?", default="ml.p3.2xlarge"))
            machines = 1
        dynamo: dict[str, str] = {}
        if _ask(questionary.confirm("Compile the model with torch.compile?", default=False)):
            dynamo["dynamo_backend"] = _ask(
                questionary.select("Backend?", choices=DYNAMO_BACKENDS, default="INDUCTOR")
            )
            dynamo["dynamo_mode"] = _ask(questionary.select("Mode?", choices=TORCH_DYNAMO_MODES))
        precision = _ask(questionary.select("Mixed precision?", choices=["no", "fp16", "bf16", "fp8"]))
    except KeyboardInterrupt:
        return None
    return SageMakerConfig(
        compute_environment=ComputeEnvironment.AMAZON_SAGEMAKER,
        distributed_type=kind,
        mixed_precision=precision,
        use_cpu=False,
        debug=False,
        ec2_instance_type=instance,
        iam_role_name=role,
        region=region,
        num_machines=machines,
        dynamo_config=dynamo or None,
    )
