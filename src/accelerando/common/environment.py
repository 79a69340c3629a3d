"""Helpers for environment variables and the process's CPU placement.

``patch_environment`` and ``clear_environment`` change ``os.environ`` only for the duration of a
``with`` block and always restore it, which is what tests and launch helpers need.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from accelerando.common import imports
from accelerando.core.devices.affinity import set_numa_affinity

__all__ = [
    "CPUInformation",
    "are_libraries_initialized",
    "check_cuda_fp8_capability",
    "check_cuda_p2p_ib_support",
    "clear_environment",
    "convert_dict_to_env_variables",
    "get_cpu_distributed_information",
    "get_current_device_type",
    "get_driver_version",
    "get_gpu_info",
    "get_int_from_env",
    "override_numa_affinity",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "set_numa_affinity",
    "str_to_bool",
]

# The reference logs this code under its utils path; scripts and tests listen there.
logger = logging.getLogger("accelerando.utils.environment")

_TRUE_STRINGS = frozenset({"y", "yes", "t", "true", "on", "1"})
_FALSE_STRINGS = frozenset({"n", "no", "f", "false", "off", "0"})
# Variables that describe a launched run: ours and the reference's (scripts migrated from it set them).
_PURGED_PREFIXES = ("ACCELERATE_", "ACCELERANDO_")

T = TypeVar("T")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def str_to_bool(value: str | bool | int, to_bool: bool = False) -> int | bool:
    """Interpret a yes/no string the way config files and environment variables write it.

    True values: ``y``, ``yes``, ``t``, ``true``, ``on``, ``1``; false values: ``n``, ``no``, ``f``,
    ``false``, ``off``, ``0`` (case-insensitive, surrounding spaces ignored).

    Args:
        value: the string to interpret (a bool or 0/1 int is passed through).
        to_bool: return ``True``/``False`` instead of ``1``/``0``.

    Returns:
        1 or 0 (or True/False when ``to_bool``).

    Raises:
        ValueError: if the string is neither a true nor a false spelling.
    """
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        result = bool(value)
    else:
        text = str(value).strip().lower()
        if text in _TRUE_STRINGS:
            result = True
        elif text in _FALSE_STRINGS:
            result = False
        else:
            raise ValueError(
                f"Invalid truth value {value!r}: use one of {sorted(_TRUE_STRINGS)} for true "
                f"or {sorted(_FALSE_STRINGS)} for false."
            )
    return result if to_bool else int(result)


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Read a yes/no flag from an environment variable.

    Args:
        key: the variable's name.
        default: the answer when the variable is unset or empty.

    Returns:
        The flag's value.

    Raises:
        ValueError: if the variable holds something that is not a yes/no spelling.
    """
    value = os.environ.get(key, "")
    if value.strip() == "":
        return default
    try:
        return bool(str_to_bool(value, to_bool=True))
    except ValueError as err:
        raise ValueError(f"Environment variable {key}={value!r} is not a yes/no value: {err}") from None


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """Read a free-form choice (``"fp16"``, ``"FULL_SHARD"``) from an environment variable.

    Args:
        key: the variable's name.
        default: the answer when the variable is unset (converted with ``str``).

    Returns:
        The variable's value as written, or ``str(default)``.
    """
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys: Iterable[str], default: int) -> int:
    """Return the integer value of the first variable in ``env_keys`` that is set and non-negative.

    Args:
        env_keys: variable names, most preferred first (e.g. ``["LOCAL_RANK", "MPI_LOCALRANKID"]``).
        default: the answer when none is set.

    Returns:
        The first usable value, else ``default``.

    Raises:
        ValueError: if a set variable is not an integer.
    """
    for key in env_keys:
        raw = os.environ.get(key, "").strip()
        if raw == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(
                f"Environment variable {key}={raw!r} must be an integer; fix or unset it."
            ) from None
        if value >= 0:
            return value
    return default


@contextlib.contextmanager
def patch_environment(**kwargs: object) -> Iterator[None]:
    """Set environment variables for the duration of a ``with`` block, then restore them.

    Names are upper-cased and values converted with ``str`` (so ``patch_environment(master_port=29501)``
    sets ``MASTER_PORT="29501"``). Variables that did not exist before are removed afterwards; those that
    did get their old value back, even if the block raised.

    Args:
        **kwargs: variable names and values to set.

    Yields:
        None.

    Example:
        >>> with patch_environment(omp_num_threads=1):
        ...     run()
    """
    saved: dict[str, str | None] = {}
    for name, value in kwargs.items():
        key = name.upper()
        saved.setdefault(key, os.environ.get(key))
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Empty ``os.environ`` for the duration of a ``with`` block, then put back exactly what was there.

    Variables set inside the block are discarded on exit.

    Yields:
        None.
    """
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _restore_launch_variables(before: dict[str, str]) -> None:
    for key in list(os.environ):
        if key.startswith(_PURGED_PREFIXES) and key not in before:
            del os.environ[key]
    for key, value in before.items():
        os.environ[key] = value


def _purging(func: Callable[_P, _R]) -> Callable[_P, _R]:
    if getattr(func, "_purges_launch_variables", False):
        return func

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        before = {k: v for k, v in os.environ.items() if k.startswith(_PURGED_PREFIXES)}
        try:
            return func(*args, **kwargs)
        finally:
            _restore_launch_variables(before)

    wrapper._purges_launch_variables = True  # type: ignore[attr-defined]
    return wrapper


def _purge_test_methods(cls: type) -> None:
    for name, member in list(vars(cls).items()):
        if inspect.isfunction(member) and (name.startswith("test") or name in ("setUp", "tearDown")):
            setattr(cls, name, _purging(member))


def _purge_class(cls: type) -> None:
    """Wrap the test methods of ``cls`` and of every class later derived from it."""
    _purge_test_methods(cls)
    inherited = cls.__dict__.get("__init_subclass__")

    def __init_subclass__(subclass: type, **kwargs: object) -> None:
        if inherited is not None:
            inherited.__get__(None, subclass)(**kwargs)
        else:
            super(cls, subclass).__init_subclass__(**kwargs)  # type: ignore[misc]
        _purge_test_methods(subclass)

    cls.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]


def purge_accelerate_environment(func_or_cls: T) -> T:
    """Undo, after each call, the ``ACCELERATE_*`` / ``ACCELERANDO_*`` variables the call changed.

    Creating an ``Accelerator`` or a plugin may record settings in the environment; tests decorated
    with this see a clean environment afterwards. Applied to a class, every method whose name starts
    with ``test`` (and ``setUp`` / ``tearDown``) is wrapped, in the class and in every class derived
    from it later.

    Args:
        func_or_cls: a function or a (test) class.

    Returns:
        The wrapped function, or the same class with its test methods wrapped.

    Raises:
        TypeError: if given something that is neither a class nor a callable.
    """
    if inspect.isclass(func_or_cls):
        _purge_class(func_or_cls)
        return func_or_cls
    if callable(func_or_cls):
        return _purging(func_or_cls)  # type: ignore[return-value]
    raise TypeError(
        f"purge_accelerate_environment decorates a function or a class, not {type(func_or_cls).__name__}."
    )


# --- libraries and processes -------------------------------------------------------------------------


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Return which of the named libraries this process has already imported.

    Useful before forking (``notebook_launcher``): a library that initialised an accelerator runtime
    at import can make forked children fail.

    Args:
        *library_names: top-level module names (``"torch_xla"``, ``"tensorflow"``).

    Returns:
        The names, in the order given, that are present in ``sys.modules``.
    """
    return [name for name in library_names if name in sys.modules]


@dataclass
class CPUInformation:
    """Where this process sits in a multi-process CPU job.

    Attributes:
        rank: global rank of the process.
        world_size: number of processes in the job.
        local_rank: rank of the process on its machine.
        local_world_size: number of processes on its machine.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


# torchrun's names first, then those of the MPI flavours (Intel MPI / MPICH, Open MPI, MVAPICH).
_CPU_RANK_KEYS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
_CPU_SIZE_KEYS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
_CPU_LOCAL_RANK_KEYS = (
    "LOCAL_RANK",
    "MPI_LOCALRANKID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
)
_CPU_LOCAL_SIZE_KEYS = (
    "LOCAL_WORLD_SIZE",
    "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_LOCAL_SIZE",
)


def get_cpu_distributed_information() -> CPUInformation:
    """Read this process's rank and sizes from torchrun's or an MPI launcher's environment variables.

    Returns:
        A :class:`CPUInformation`; each field falls back to a single-process value (rank 0 of 1)
        when no launcher variable sets it.

    Raises:
        ValueError: if one of the variables is set to something that is not an integer.
    """
    return CPUInformation(
        rank=get_int_from_env(_CPU_RANK_KEYS, 0),
        world_size=get_int_from_env(_CPU_SIZE_KEYS, 1),
        local_rank=get_int_from_env(_CPU_LOCAL_RANK_KEYS, 0),
        local_world_size=get_int_from_env(_CPU_LOCAL_SIZE_KEYS, 1),
    )


# --- environment files ---------------------------------------------------------------------------------

# Characters that would break a KEY=VALUE line of a file another program sources (e.g. DeepSpeed's
# .deepspeed_env, read line by line and passed through a shell on the remote hosts).
_FORBIDDEN_ENV_CHARS = (";", "\n", "<", ">", " ")


def convert_dict_to_env_variables(current_env: Mapping[str, str]) -> list[str]:
    r"""Turn a mapping of environment variables into ``KEY=VALUE`` lines for an environment file.

    Entries with an empty key or value, or with a character that would break the line or let the
    shell reading it run something (``;``, a newline, ``<``, ``>``, a space), are left out with a
    warning naming the variable.

    Args:
        current_env: the variables to write.

    Returns:
        One ``"KEY=VALUE\n"`` string per usable entry, in the mapping's order.
    """
    lines = []
    for key, value in current_env.items():
        text = f"{key}{value}"
        if key and str(value) and not any(char in text for char in _FORBIDDEN_ENV_CHARS):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning(
                "Environment variable %s left out of the environment file: an empty name or value, or one "
                "of ; < > space or a newline, cannot be written safely.",
                key,
            )
    return lines


# --- accelerators ----------------------------------------------------------------------------------------

# (torch device type, variable that restricts which of its devices a process sees), in detection order.
_DEVICE_VISIBILITY = (
    ("mlu", "MLU_VISIBLE_DEVICES"),
    ("sdaa", "SDAA_VISIBLE_DEVICES"),
    ("musa", "MUSA_VISIBLE_DEVICES"),
    ("npu", "ASCEND_RT_VISIBLE_DEVICES"),
    ("hpu", "HABANA_VISIBLE_MODULES"),
    ("neuron", "NEURON_RT_VISIBLE_CORES"),
    ("xpu", "ZE_AFFINITY_MASK"),
)


def get_current_device_type() -> tuple[str, str]:
    """Name this machine's accelerator family and the variable that selects its visible devices.

    Vendor extensions are checked before CUDA (they are installed on purpose); without any, the
    answer is CUDA's, which is also what ``--gpu_ids`` sets on a machine without accelerators.
    Nothing is initialised.

    Returns:
        ``(device_type, visible_devices_variable)``, e.g. ``("cuda", "CUDA_VISIBLE_DEVICES")`` or
        ``("xpu", "ZE_AFFINITY_MASK")``.
    """
    checks = {
        "mlu": imports.is_mlu_available,
        "sdaa": imports.is_sdaa_available,
        "musa": imports.is_musa_available,
        "npu": imports.is_npu_available,
        "hpu": imports.is_hpu_available,
        "neuron": imports.is_neuron_available,
        "xpu": imports.is_xpu_available,
    }
    for device_type, variable in _DEVICE_VISIBILITY:
        if checks[device_type]():
            return device_type, variable
    return "cuda", "CUDA_VISIBLE_DEVICES"


def _nvidia_smi(query: str) -> list[str]:
    """Run ``nvidia-smi --query-gpu=<query>`` and return its non-empty output lines."""
    program = shutil.which("nvidia-smi")
    if program is None and sys.platform == "win32":
        candidate = os.path.join(os.environ.get("SystemRoot", r"C:\Windows"), "System32", "nvidia-smi.exe")
        program = candidate if os.path.isfile(candidate) else None
    if program is None:
        raise RuntimeError(
            "nvidia-smi was not found, so the NVIDIA GPUs cannot be queried. Fix: install the NVIDIA "
            "driver utilities or put nvidia-smi on PATH."
        )
    try:
        output = subprocess.run(
            [program, f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"nvidia-smi failed ({err}); check that the NVIDIA driver is loaded.") from err
    return [line.strip() for line in output.splitlines() if line.strip()]


def get_gpu_info() -> tuple[list[str], int]:
    """List the NVIDIA GPUs of this machine as ``nvidia-smi`` reports them (without initialising CUDA).

    Returns:
        ``(names, count)``: each GPU's product name and how many there are.

    Raises:
        RuntimeError: if ``nvidia-smi`` is missing or fails.
    """
    names = _nvidia_smi("name")
    return names, len(names)


def get_driver_version() -> str:
    """Return the NVIDIA driver version (e.g. ``"550.54.15"``), as ``nvidia-smi`` reports it.

    Returns:
        The driver version of the first GPU.

    Raises:
        RuntimeError: if ``nvidia-smi`` is missing, fails, or lists no GPU.
    """
    versions = _nvidia_smi("driver_version")
    if not versions:
        raise RuntimeError("nvidia-smi lists no GPU, so there is no driver version to report.")
    return versions[0]


# Consumer GPUs whose peer-to-peer and InfiniBand transfers hang NCCL unless the driver is recent.
_P2P_LIMITED_GPUS = ("RTX 40",)
_P2P_FIXED_DRIVER = "550.40.07"


def check_cuda_p2p_ib_support() -> bool:
    """Tell whether NCCL may use peer-to-peer and InfiniBand transfers between this machine's GPUs.

    RTX 40-series cards with a driver older than 550.40.07 hang when NCCL uses P2P or IB; for them the
    answer is False, and the launcher then sets ``NCCL_P2P_DISABLE=1`` and ``NCCL_IB_DISABLE=1``.

    Returns:
        False only for several GPUs of an affected model on an older driver; True otherwise,
        including when ``nvidia-smi`` cannot be run.
    """
    from packaging.version import InvalidVersion, Version

    try:
        names, count = get_gpu_info()
        if count <= 1 or not any(model in name for name in names for model in _P2P_LIMITED_GPUS):
            return True
        return Version(get_driver_version()) >= Version(_P2P_FIXED_DRIVER)
    except (RuntimeError, InvalidVersion):
        return True


def check_cuda_fp8_capability() -> bool:
    """Tell whether the current CUDA GPU computes in FP8 (compute capability 8.9, Ada, or later).

    Initialises CUDA when a device is present.

    Returns:
        True on an FP8-capable GPU; False without a CUDA device.
    """
    import torch

    if not imports.is_cuda_available():
        return False
    return tuple(torch.cuda.get_device_capability()) >= (8, 9)


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the CPUs nearest its GPU now, whatever ``ACCELERATE_CPU_AFFINITY`` says.

    Args:
        local_process_index: the process's index on its node (the GPU it drives).
        verbose: log the CPUs chosen.

    Raises:
        ImportError: if ``pynvml`` (which tells which CPUs are near a GPU) is not installed.
        ValueError: if ``local_process_index`` is negative.
    """
    if not imports.is_pynvml_available():
        raise ImportError(
            "Pinning a process to the CPUs of its GPU needs NVML bindings. Fix: `pip install pynvml`."
        )
    set_numa_affinity(local_process_index, verbose=verbose)


# Kernels older than this can hang multi-process jobs (a bug in their futex handling).
_MIN_KERNEL = "5.5.0"


def check_os_kernel() -> None:
    """Warn when running on a Linux kernel older than 5.5.0, on which multi-process jobs can hang.

    Other systems, and kernel versions that cannot be read, are accepted silently.
    """
    import platform

    from packaging.version import Version

    info = platform.uname()
    if info.system != "Linux":
        return
    match = re.search(r"\d+\.\d+\.\d+", info.release)
    if match is None:
        return
    if Version(match.group(0)) < Version(_MIN_KERNEL):
        found = match.group(0)
        # Formatted here: handlers and tests that read record.msg see the versions.
        logger.warning(
            f"Linux kernel {found} is older than {_MIN_KERNEL}; processes can hang there. Upgrade the "
            f"kernel to {_MIN_KERNEL} or later."
        )
