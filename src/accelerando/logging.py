"""Process-aware logging: ``get_logger`` returns a logger that speaks once per run, not once per process.

In a run of N processes every ``logger.info(...)`` would print N times. The adapter returned by
:func:`get_logger` logs on the main process only unless a call says ``main_process_only=False``; with
``in_order=True`` as well, processes take turns (rank 0 first) separated by barriers.

It works before any :class:`~accelerando.state.PartialState` exists: the rank is read from the live
process group when there is one, else from the launcher's ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE``
variables, else the process is treated as the only one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from types import TracebackType
from typing import NamedTuple, TypeAlias, TypedDict, TypeVar

from typing_extensions import Unpack

from accelerando.core.settings.resolve import environment_value

__all__ = ["MultiProcessAdapter", "get_logger"]

#: What ``exc_info=`` accepts in :mod:`logging` calls.
ExcInfo: TypeAlias = (
    bool
    | BaseException
    | tuple[type[BaseException], BaseException, TracebackType | None]
    | tuple[None, None, None]
    | None
)


class LogOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`logging.Logger.log`."""

    exc_info: ExcInfo
    stack_info: bool
    stacklevel: int
    extra: Mapping[str, object] | None


class AdapterOptions(LogOptions, total=False):
    """:class:`LogOptions` plus the process selection of :class:`MultiProcessAdapter`."""

    main_process_only: bool
    in_order: bool


OptionsT = TypeVar("OptionsT", bound=Mapping[str, object])


class _ProcessView(NamedTuple):
    rank: int
    local_rank: int
    world_size: int


def _env_int(name: str, default: int) -> int:
    # Read directly (not through settings/): logging must work before any settings are resolved.
    value = os.environ.get(name, "")
    return int(value) if value.strip().lstrip("-").isdigit() else default


def _process_view() -> _ProcessView:
    """Return this process's rank, local rank and world size without creating any state.

    The live process group wins; otherwise the launcher's environment; otherwise a single process.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        return _ProcessView(rank, _env_int("LOCAL_RANK", rank), dist.get_world_size())
    rank = _env_int("RANK", 0)
    return _ProcessView(rank, _env_int("LOCAL_RANK", rank), _env_int("WORLD_SIZE", 1))


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


class MultiProcessAdapter(logging.LoggerAdapter):
    """A :class:`logging.LoggerAdapter` whose log calls know about processes.

    Every log method (``debug``, ``info``, ``warning``, ``error``, ``critical``, ``exception``, ``log``)
    accepts two extra keyword arguments:

    - ``main_process_only`` (default ``True``): log only on the global main process (rank 0).
    - ``in_order`` (default ``False``): with ``main_process_only=False``, let each process log in rank
      order, waiting on a barrier between turns. Every process must make the call, or the run hangs.

    ``warning_once`` logs a given message once per process (cached on the message text).
    """

    def __init__(self, logger: logging.Logger, extra: Mapping[str, object] | None = None) -> None:
        super().__init__(logger, extra or {})
        self._warned: set[str] = set()

    def process(self, msg: object, kwargs: OptionsT) -> tuple[object, OptionsT]:
        """Pass the message through unchanged (kept for :class:`logging.LoggerAdapter`'s contract)."""
        return msg, kwargs

    def log(
        self,
        level: int,
        msg: object,
        *args: object,
        main_process_only: bool = True,
        in_order: bool = False,
        **kwargs: Unpack[LogOptions],
    ) -> None:
        """Log ``msg`` at ``level`` on the processes selected by ``main_process_only`` / ``in_order``.

        Args:
            level: a :mod:`logging` level (``logging.INFO``, ...).
            msg: the message (``%``-style formatted with ``args``, as in :mod:`logging`).
            *args: formatting arguments.
            **kwargs: :mod:`logging` keyword arguments plus ``main_process_only`` and ``in_order``.

        Raises:
            TypeError: ``main_process_only`` or ``in_order`` is not a bool.
        """
        if not isinstance(main_process_only, bool) or not isinstance(in_order, bool):
            raise TypeError(
                "main_process_only and in_order must be True or False; "
                f"got main_process_only={main_process_only!r}, in_order={in_order!r}."
            )
        # Default stacklevel points records at the caller of logger.info(...), not at this adapter.
        kwargs.setdefault("stacklevel", 3)
        if not self.isEnabledFor(level):
            return
        view = _process_view()
        if main_process_only or not in_order:
            if not main_process_only or view.rank == 0:
                message, options = self.process(msg, kwargs)
                self.logger.log(level, message, *args, **options)
            return
        for turn in range(view.world_size):
            if turn == view.rank:
                message, options = self.process(msg, kwargs)
                self.logger.log(level, message, *args, **options)
            _barrier()

    def debug(self, msg: object, *args: object, **kwargs: Unpack[AdapterOptions]) -> None:
        """Log at DEBUG level (see :meth:`log` for the extra keywords)."""
        self._dispatch(logging.DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: object, **kwargs: Unpack[AdapterOptions]) -> None:
        """Log at INFO level (see :meth:`log` for the extra keywords)."""
        self._dispatch(logging.INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: object, **kwargs: Unpack[AdapterOptions]) -> None:
        """Log at WARNING level (see :meth:`log` for the extra keywords)."""
        self._dispatch(logging.WARNING, msg, args, kwargs)

    def error(self, msg: object, *args: object, **kwargs: Unpack[AdapterOptions]) -> None:
        """Log at ERROR level (see :meth:`log` for the extra keywords)."""
        self._dispatch(logging.ERROR, msg, args, kwargs)

    def critical(self, msg: object, *args: object, **kwargs: Unpack[AdapterOptions]) -> None:
        """Log at CRITICAL level (see :meth:`log` for the extra keywords)."""
        self._dispatch(logging.CRITICAL, msg, args, kwargs)

    def exception(self, msg: object, *args: object, **kwargs: Unpack[AdapterOptions]) -> None:
        """Log at ERROR level with the current exception's traceback."""
        kwargs.setdefault("exc_info", True)
        self._dispatch(logging.ERROR, msg, args, kwargs)

    def warning_once(self, msg: object, *args: object, **kwargs: Unpack[AdapterOptions]) -> None:
        """Log a warning the first time this exact message is seen in this process, then stay silent."""
        key = str(msg)
        if key in self._warned:
            return
        self._warned.add(key)
        self._dispatch(logging.WARNING, msg, args, kwargs)

    def _dispatch(self, level: int, msg: object, args: tuple[object, ...], kwargs: AdapterOptions) -> None:
        # One extra frame (this helper) between the caller and logger.log.
        kwargs.setdefault("stacklevel", 4)
        self.log(level, msg, *args, **kwargs)


def _level_from_settings() -> str | None:
    # The ``log_level`` setting (ACCELERANDO_LOG_LEVEL, or the reference's ACCELERATE_LOG_LEVEL), read
    # on its own: loggers are made at import time, before any settings are resolved.

    return environment_value("log_level")


def get_logger(name: str, log_level: str | int | None = None) -> MultiProcessAdapter:
    """Return a process-aware logger for ``name`` (usually ``__name__``).

    Args:
        name: the logger name, as for :func:`logging.getLogger`.
        log_level: level to set on the underlying logger (``"INFO"``, ``logging.DEBUG``, ...). When
            ``None``, ``ACCELERANDO_LOG_LEVEL`` (or the reference's ``ACCELERATE_LOG_LEVEL``) is used if
            set; otherwise the logger's level is left as it is.

    Returns:
        A :class:`MultiProcessAdapter`; its methods accept ``main_process_only=True`` and
        ``in_order=False``.

    Raises:
        ValueError: the level (argument or environment variable) is not a logging level name.

    Example:
        >>> from accelerando import PartialState
        >>> from accelerando.logging import get_logger
        >>> state = PartialState()  # an Accelerator creates it in a training script
        >>> logger = get_logger("train", log_level="INFO")  # usually get_logger(__name__)
        >>> logger.info("logged once per run")
        >>> logger.info("logged by every process", main_process_only=False)
    """
    if log_level is None:
        log_level = _level_from_settings()
    logger = logging.getLogger(name)
    if log_level is not None:
        level = log_level.upper() if isinstance(log_level, str) else log_level
        if isinstance(level, str) and not isinstance(logging.getLevelName(level), int):
            raise ValueError(
                f"Unknown log level {log_level!r}; use one of DEBUG, INFO, WARNING, ERROR, CRITICAL "
                "(in get_logger(log_level=...) or ACCELERANDO_LOG_LEVEL)."
            )
        logger.setLevel(level)
    return MultiProcessAdapter(logger, {})
