"""The SageMaker launch helper: a ``HuggingFace`` estimator's arguments for a launch namespace."""

from __future__ import annotations

import argparse
import ast
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from accelerando.common.names import merge_dicts
from accelerando.core.enums import DynamoBackend, PrecisionType
from accelerando.launchers.reference.env import setting_text, setup_fp8_env

__all__ = ["convert_nargs_to_dict", "prepare_sagemager_args_inputs"]

# A hyperparameter as SageMaker receives it: the script argument's text read as a bool, number or text.
Hyperparameter = bool | int | float | str


class SageMakerJob(Protocol):
    """What the estimator is built from: the fields of a SageMaker config (``SageMakerConfig``).

    The optional ones (``image_uri``, the inputs and metrics files, ``additional_args``) are read
    when present.
    """

    @property
    def ec2_instance_type(self) -> str: ...
    @property
    def iam_role_name(self) -> str: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def region(self) -> str: ...
    @property
    def num_machines(self) -> int: ...
    @property
    def base_job_name(self) -> str: ...
    @property
    def pytorch_version(self) -> str: ...
    @property
    def transformers_version(self) -> str: ...
    @property
    def py_version(self) -> str: ...


def _typed_value(text: str) -> Hyperparameter:
    """``"False"``/``"True"`` -> bool, then int, then float; anything else stays text (the reference's reading)."""
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def convert_nargs_to_dict(nargs: Sequence[str]) -> dict[str, Hyperparameter]:
    """Turn a script's ``--name value`` arguments into SageMaker hyperparameters, with typed values.

    Each ``--name`` (or ``-name``; dashes inside become underscores) must be followed by its value:
    ``"True"``/``"False"`` become booleans, numbers become ``int`` or ``float``, the rest stays text.

    Args:
        nargs: the script's arguments, e.g. ``["--epochs", "3", "--do_train", "False"]``.

    Returns:
        Name -> value, e.g. ``{"epochs": 3, "do_train": False}``.

    Raises:
        ValueError: a flag has no value (SageMaker cannot pass ``store_true``-style switches), or a
            value has no flag before it.
    """
    items = list(nargs)
    result: dict[str, Hyperparameter] = {}
    index = 0
    while index < len(items):
        token = items[index]
        if not token.startswith("-"):
            raise ValueError(
                f"SageMaker passes script arguments as --name value pairs, but {token!r} has no name. "
                f"Fix: write it as --name {token}."
            )
        if index + 1 >= len(items) or items[index + 1].startswith("-"):
            raise ValueError(
                f"SageMaker doesn't support argparse actions for `store_true` or `store_false`: {token} has no "
                f"value. Please define explicit types. Fix: give it one ({token} True) and a type in the script."
            )
        result[token.lstrip("-").replace("-", "_")] = _typed_value(items[index + 1])
        index += 2
    return result


def _hyperparameters(script_args: Sequence[str]) -> dict[str, Hyperparameter]:
    """``["--lr", "0.1", "--fp16", "--name", "x"]`` -> ``{"lr": 0.1, "fp16": True, "name": "x"}``."""
    result: dict[str, Hyperparameter] = {}
    index = 0
    items = list(script_args)
    while index < len(items):
        token = items[index]
        if not token.startswith("-"):
            raise ValueError(
                f"SageMaker passes script arguments as hyperparameters, so each must be --name [value]; "
                f"{token!r} is a value without a name. Fix: write it as --name {token}."
            )
        key = token.lstrip("-")
        if "=" in key:
            key, raw = key.split("=", 1)
            index += 1
        elif index + 1 < len(items) and not items[index + 1].startswith("-"):
            raw = items[index + 1]
            index += 2
        else:
            result[key] = True
            index += 1
            continue
        try:
            result[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            result[key] = raw
    return result


def _read_table(path: str | os.PathLike[str], what: str) -> list[list[str]]:
    """Rows of a tab-separated file with a header line (which is skipped)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    rows = [line.split("\t") for line in lines[1:] if line.strip()]
    for number, row in enumerate(rows, start=2):
        if len(row) < 2:
            raise ValueError(f"{what} file {path}: line {number} needs two tab-separated columns.")
    return rows


def prepare_sagemager_args_inputs(
    sagemaker_config: SageMakerJob, args: argparse.Namespace
) -> tuple[dict[str, object], dict[str, str] | None]:
    """Build the keyword arguments of a SageMaker ``HuggingFace`` estimator for a launch.

    Sets ``AWS_DEFAULT_REGION`` and the credentials (``AWS_PROFILE``, or the access keys from
    ``args.aws_access_key_id`` / ``args.aws_secret_access_key``) in ``os.environ``, as the SageMaker
    SDK reads them from there.

    Args:
        sagemaker_config: the SageMaker section of a config file (``region``, ``profile``,
            ``iam_role_name``, ``ec2_instance_type``, ``num_machines``, ``base_job_name``, ``image_uri``,
            ``py_version``, ``pytorch_version``, ``transformers_version``, ``distributed_type``,
            ``sagemaker_inputs_file``, ``sagemaker_metrics_file``, ``additional_args``).
        args: the launch namespace (``training_script`` must be a ``.py`` file; its arguments become
            hyperparameters).

    Returns:
        ``(estimator_kwargs, inputs)``: the estimator's arguments (entry point, source folder, role,
        versions, instances, distribution, hyperparameters, environment, metric definitions) and the
        training inputs read from ``sagemaker_inputs_file`` (None without one).

    Raises:
        OSError: without a profile or access keys.
        ValueError: for a script that is not a Python file, or an unknown mixed precision or dynamo
            backend.
    """
    os.environ["AWS_DEFAULT_REGION"] = str(sagemaker_config.region)
    if getattr(sagemaker_config, "profile", None):
        os.environ["AWS_PROFILE"] = str(sagemaker_config.profile)
    elif getattr(args, "aws_access_key_id", None) and getattr(args, "aws_secret_access_key", None):
        os.environ["AWS_ACCESS_KEY_ID"] = args.aws_access_key_id
        os.environ["AWS_SECRET_ACCESS_KEY"] = args.aws_secret_access_key
    else:
        raise OSError(
            "SageMaker needs AWS credentials. Fix: set `profile` in the SageMaker config, or pass "
            "--aws_access_key_id and --aws_secret_access_key."
        )
    script = Path(args.training_script)
    if script.suffix != ".py":
        raise ValueError(f"SageMaker runs a Python script; {script.name!r} is not a .py file.")
    precision_text = str(getattr(args, "mixed_precision", None) or "no").lower()
    dynamo_text = str(getattr(args, "dynamo_backend", None) or "no").upper()
    if precision_text not in PrecisionType.list():
        raise ValueError(f"mixed_precision {precision_text!r} is not one of {PrecisionType.list()}.")
    if dynamo_text not in DynamoBackend.list():
        raise ValueError(f"dynamo_backend {dynamo_text!r} is not one of {DynamoBackend.list()}.")
    distributed_type = str(getattr(sagemaker_config, "distributed_type", "NO"))
    environment = {
        "ACCELERATE_USE_SAGEMAKER": "true",
        "ACCELERATE_MIXED_PRECISION": precision_text,
        "ACCELERATE_DYNAMO_BACKEND": dynamo_text,
        "ACCELERATE_DYNAMO_MODE": str(getattr(args, "dynamo_mode", None) or "default"),
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": setting_text(bool(getattr(args, "dynamo_use_fullgraph", False))),
        "ACCELERATE_DYNAMO_USE_DYNAMIC": setting_text(bool(getattr(args, "dynamo_use_dynamic", False))),
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": setting_text(
            bool(getattr(args, "dynamo_use_regional_compilation", False))
        ),
        "ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE": distributed_type,
    }
    if precision_text == "fp8":
        setup_fp8_env(args, environment)
    distribution = None
    if distributed_type == "DATA_PARALLEL":
        distribution = {"smdistributed": {"dataparallel": {"enabled": True}}}
    inputs = None
    inputs_file = getattr(sagemaker_config, "sagemaker_inputs_file", None)
    if inputs_file:
        inputs = {row[0]: row[1] for row in _read_table(inputs_file, "SageMaker inputs")}
    metrics = None
    metrics_file = getattr(sagemaker_config, "sagemaker_metrics_file", None)
    if metrics_file:
        metrics = [
            {"Name": row[0], "Regex": row[1]} for row in _read_table(metrics_file, "SageMaker metrics")
        ]
    estimator: dict[str, object] = {
        "image_uri": getattr(sagemaker_config, "image_uri", None),
        "entry_point": script.name,
        "source_dir": str(script.parent) if str(script.parent) else ".",
        "role": sagemaker_config.iam_role_name,
        "transformers_version": sagemaker_config.transformers_version,
        "pytorch_version": sagemaker_config.pytorch_version,
        "py_version": sagemaker_config.py_version,
        "base_job_name": sagemaker_config.base_job_name,
        "instance_count": sagemaker_config.num_machines,
        "instance_type": sagemaker_config.ec2_instance_type,
        "debugger_hook_config": False,
        "distribution": distribution,
        "hyperparameters": _hyperparameters(getattr(args, "training_script_args", None) or ()),
        "environment": environment,
        "metric_definitions": metrics,
    }
    additional = getattr(sagemaker_config, "additional_args", None)
    if additional:
        estimator = dict(merge_dicts(additional, estimator))
    return estimator, inputs
