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

from accelerando.devices.affinity import set_numa_affinity

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
