"""Environment helpers of the launch helpers: ``PATH``-like values, TPU, FP8 and parallelism options.

Each ``prepare_*`` / ``setup_*`` function here adds variables to an environment dict the caller is
building; none of them changes ``os.environ`` (which :func:`env_var_path_add` only reads).
"""

from __future__ import annotations

import argparse
import os

__all__ = [
    "env_var_path_add",
    "prepare_extend_env_parallelism_config",
    "prepare_tpu",
    "setup_fp8_env",
    "setting_text",
]


def env_var_path_add(env_var_name: str, path_to_add: str | os.PathLike[str]) -> str:
    """Return the value of a ``PATH``-like variable with one more entry appended.

    The variable itself is not changed; empty entries of the current value are dropped.

    Args:
        env_var_name: the variable (``"PYTHONPATH"``).
        path_to_add: the folder to append.

    Returns:
        The ``:``-separated (``;`` on Windows) new value.
    """
    entries = [p for p in os.environ.get(env_var_name, "").split(os.pathsep) if p]
    entries.append(str(path_to_add))
    return os.pathsep.join(entries)


def setting_text(value: object) -> str:
    """A setting's value as the launcher writes it into a variable (``true``/``false``, ``a,b``, ``str``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def prepare_tpu(
    args: argparse.Namespace, current_env: dict[str, str], pod: bool = False
) -> tuple[argparse.Namespace, dict[str, str]]:
    """Add what a TPU (XLA) launch needs to ``current_env``, and to ``args`` for a TPU pod.

    bf16 on XLA is asked for through variables: ``XLA_USE_BF16=1`` (every float in bf16) or, with
    ``downcast_bf16``, ``XLA_DOWNCAST_BF16=1`` (float32 stays in fp32 where XLA allows it).

    Args:
        args: the launch namespace (``mixed_precision``, ``downcast_bf16``, ``debug``; ``tpu_vm`` and
            ``tpu_name`` for a pod).
        current_env: the environment being prepared; changed in place.
        pod: prepare a launch over a TPU pod: ``args.vm`` and ``args.tpu`` are set from ``tpu_vm`` and
            ``tpu_name`` (the names PyTorch/XLA's pod launcher reads).

    Returns:
        ``(args, current_env)``.
    """
    if getattr(args, "mixed_precision", None) == "bf16":
        if getattr(args, "downcast_bf16", False):
            current_env["XLA_DOWNCAST_BF16"] = "1"
        else:
            current_env["XLA_USE_BF16"] = "1"
    if getattr(args, "debug", False):
        current_env["ACCELERATE_DEBUG_MODE"] = "true"
    if pod:
        args.vm = getattr(args, "tpu_vm", None)
        args.tpu = getattr(args, "tpu_name", None)
    return args, current_env


_FP8_PRECISION_PARTS = ("FPROP", "DGRAD", "WGRAD")


def setup_fp8_env(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """Add the FP8 options of a launch namespace to ``current_env`` under the reference's names.

    Every ``fp8_<name>`` attribute that is set becomes ``ACCELERATE_FP8_<NAME>``; the three flags of
    ``fp8_override_linear_precision`` become ``ACCELERATE_FP8_OVERRIDE_FPROP`` / ``_DGRAD`` / ``_WGRAD``.
    The attributes ``accelerando launch`` stores them under (``compat_fp8_<name>``) are read too.

    Args:
        args: the launch namespace.
        current_env: the environment being prepared; changed in place.

    Returns:
        ``current_env``.

    Raises:
        ValueError: if ``fp8_override_linear_precision`` does not hold three values.
    """
    for attribute, value in vars(args).items():
        name = attribute[len("compat_") :] if attribute.startswith("compat_fp8_") else attribute
        if not name.startswith("fp8_") or value is None:
            continue
        if name == "fp8_override_linear_precision":
            parts = value.split(",") if isinstance(value, str) else list(value)
            if len(parts) != 3:
                raise ValueError(
                    f"fp8_override_linear_precision needs three booleans (fprop, dgrad, wgrad), got {value!r}."
                )
            for part, flag in zip(_FP8_PRECISION_PARTS, parts, strict=True):
                current_env[f"ACCELERATE_FP8_OVERRIDE_{part}"] = setting_text(flag).strip().lower()
        else:
            current_env[f"ACCELERATE_{name.upper()}"] = setting_text(value)
    return current_env


def prepare_extend_env_parallelism_config(
    args: argparse.Namespace, current_env: dict[str, str]
) -> dict[str, str]:
    """Pass the ``parallelism_config_*`` options of a launch namespace to the processes.

    Each set attribute ``parallelism_config_<name>`` becomes the variable ``PARALLELISM_CONFIG_<NAME>``
    (what :class:`~accelerando.parallelism_config.ParallelismConfig` reads), and
    ``ACCELERATE_USE_PARALLELISM_CONFIG=true`` tells the processes to build one.

    Args:
        args: the launch namespace.
        current_env: the environment being prepared; changed in place.

    Returns:
        ``current_env``.
    """
    given = {
        attribute: value
        for attribute, value in vars(args).items()
        if attribute.startswith("parallelism_config_") and value is not None
    }
    for attribute, value in given.items():
        current_env[attribute.upper()] = setting_text(value)
    if given:
        current_env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    return current_env
