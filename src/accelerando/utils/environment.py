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
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

__all__ = [
    "clear_environment",
    "get_int_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "set_numa_affinity",
    "str_to_bool",
]

logger = logging.getLogger(__name__)

_TRUE_STRINGS = frozenset({"y", "yes", "t", "true", "on", "1"})
_FALSE_STRINGS = frozenset({"n", "no", "f", "false", "off", "0"})
# Variables that describe a launched run: ours and the reference's (scripts migrated from it set them).
_PURGED_PREFIXES = ("ACCELERATE_", "ACCELERANDO_")

T = TypeVar("T")


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
def patch_environment(**kwargs: Any) -> Iterator[None]:
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


def _purging(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before = {k: v for k, v in os.environ.items() if k.startswith(_PURGED_PREFIXES)}
        try:
            return func(*args, **kwargs)
        finally:
            _restore_launch_variables(before)

    return wrapper


def purge_accelerate_environment(func_or_cls: T) -> T:
    """Undo, after each call, the ``ACCELERATE_*`` / ``ACCELERANDO_*`` variables the call changed.

    Creating an ``Accelerator`` or a plugin may record settings in the environment; tests decorated
    with this see a clean environment afterwards. Applied to a class, every method whose name starts
    with ``test`` (and ``setUp`` / ``tearDown``) is wrapped.

    Args:
        func_or_cls: a function or a (test) class.

    Returns:
        The wrapped function, or the same class with its test methods wrapped.

    Raises:
        TypeError: if given something that is neither a class nor a callable.
    """
    if inspect.isclass(func_or_cls):
        for name, member in list(vars(func_or_cls).items()):
            if inspect.isfunction(member) and (name.startswith("test") or name in ("setUp", "tearDown")):
                setattr(func_or_cls, name, _purging(member))
        return func_or_cls
    if callable(func_or_cls):
        return _purging(func_or_cls)  # type: ignore[return-value]
    raise TypeError(
        f"purge_accelerate_environment decorates a function or a class, not {type(func_or_cls).__name__}."
    )


def _gpu_cpu_affinity(device_index: int) -> list[int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        words = max(1, ((os.cpu_count() or 1) + 63) // 64)
        mask_words = pynvml.nvmlDeviceGetCpuAffinity(handle, words)
    finally:
        pynvml.nvmlShutdown()
    cpus = []
    for word_index, word in enumerate(mask_words):
        cpus.extend(word_index * 64 + bit for bit in range(64) if (int(word) >> bit) & 1)
    return cpus


def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> bool:
    """Pin this process to the CPUs of the NUMA node closest to its GPU.

    Uses NVML (``pynvml``) to ask which CPUs are local to GPU ``local_process_index``, then
    ``os.sched_setaffinity``. Without NVML, a CUDA device or ``sched_setaffinity`` (non-Linux) this
    logs why and changes nothing.

    Args:
        local_process_index: the process's index on its node (the GPU it drives).
        verbose: log the CPUs chosen. The runtime calls this for the ``enable_cpu_affinity`` setting
            (``ACCELERATE_CPU_AFFINITY``) with the ``debug`` setting (``ACCELERATE_DEBUG_MODE``).

    Returns:
        True when the affinity was changed.

    Raises:
        ValueError: if ``local_process_index`` is negative.
    """
    from accelerando.utils.imports import is_cuda_available, is_pynvml_available

    if local_process_index < 0:
        raise ValueError(f"local_process_index must be >= 0, got {local_process_index}.")
    verbose = bool(verbose)
    if not hasattr(os, "sched_setaffinity"):
        logger.info("set_numa_affinity: this platform cannot set CPU affinity; nothing changed.")
        return False
    if not is_cuda_available() or not is_pynvml_available():
        logger.info("set_numa_affinity needs a CUDA device and `pip install pynvml`; nothing changed.")
        return False
    # NVML numbers physical GPUs; CUDA_VISIBLE_DEVICES may remap them for this process.
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    device_index = local_process_index
    if local_process_index < len(visible) and visible[local_process_index].isdigit():
        device_index = int(visible[local_process_index])
    cpus = _gpu_cpu_affinity(device_index)
    if not cpus:
        return False
    os.sched_setaffinity(0, cpus)
    if verbose:
        logger.info(
            "Process %d pinned to CPUs %s (NUMA node of GPU %d).", local_process_index, cpus, device_index
        )
    return True
