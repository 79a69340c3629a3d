"""Out-of-memory helpers: find the largest batch size that fits, free memory, recognise OOM errors.

:func:`find_executable_batch_size` keeps the reference's decorator contract (the wrapped function
receives the batch size as its first argument and the wrapper returns the function's result), but
searches differently: on an out-of-memory error it halves the size until one run succeeds, then
bisects between the largest success and the smallest failure, so it ends on the largest size that
runs in O(log n) tries instead of stepping down 10% at a time. The size found is kept on the
wrapper (``.batch_size``) and logged.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

from accelerando.logging import get_logger

__all__ = ["BatchSizeFinder", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"]

logger = get_logger(__name__)

# Substrings of the RuntimeError messages each allocator raises when it runs out of memory.
_OOM_MESSAGES = (
    "CUDA out of memory.",
    "CUDA error: out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",  # cuDNN's answer to a too-large workspace request
    "DefaultCPUAllocator: can't allocate memory",
    "XPU out of memory.",
    "NPU out of memory.",
    "MPS backend out of memory",
    "HIP out of memory.",
)


def _empty_device_caches() -> None:
    from accelerando.devices import DEVICE_BACKENDS

    for backend in DEVICE_BACKENDS:
        # An uninitialised CUDA runtime holds no cache; touching it would only initialise it.
        if backend.name == "cuda" and not torch.cuda.is_initialized():
            continue
        try:
            backend.empty_cache()
        except (RuntimeError, AttributeError):
            continue


def release_memory(*objects: Any) -> list[None]:
    """Drop references to ``objects``, run the garbage collector and empty device caches.

    Rebind the names yourself with the returned list, since a function cannot delete its caller's
    variables::

        model, optimizer = release_memory(model, optimizer)

    Args:
        *objects: the objects to release.

    Returns:
        A list of ``None``, one per object.
    """
    released: list[Any] = list(objects)
    for index in range(len(released)):
        released[index] = None
    del objects
    gc.collect()
    _empty_device_caches()
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Tell whether ``exception`` is an out-of-memory error that a smaller batch might avoid.

    Recognises ``torch.OutOfMemoryError`` (CUDA and other accelerators), Python's ``MemoryError`` and
    the out-of-memory ``RuntimeError`` messages of the CPU, CUDA, ROCm, XPU, NPU and MPS allocators.

    Args:
        exception: the exception raised by a training or inference step.

    Returns:
        True for an out-of-memory error, False for anything else.
    """
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if (oom_type is not None and isinstance(exception, oom_type)) or isinstance(exception, MemoryError):
        return True
    if (
        isinstance(exception, RuntimeError)
        and len(exception.args) == 1
        and isinstance(exception.args[0], str)
    ):
        return any(message in exception.args[0] for message in _OOM_MESSAGES)
    return False


def _call_reduce_fn(reduce_fn: Callable[..., int], batch_size: int) -> int:
    try:
        takes_argument = len(inspect.signature(reduce_fn).parameters) > 0
    except (TypeError, ValueError):
        takes_argument = True
    new_size = reduce_fn(batch_size) if takes_argument else reduce_fn()
    if not isinstance(new_size, int) or isinstance(new_size, bool):
        raise TypeError(f"reduce_batch_size_fn must return an int batch size, got {new_size!r}.")
    return new_size


class BatchSizeFinder:
    """The wrapper returned by :func:`find_executable_batch_size`; call it like the wrapped function.

    Attributes:
        batch_size: the largest batch size that ran in the last call (``None`` before any call).
        tries: ``(batch_size, succeeded)`` for every attempt of the last call, in order.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        starting_batch_size: int,
        reduce_batch_size_fn: Callable[..., int] | None,
        max_batch_size: int | None,
    ) -> None:
        functools.update_wrapper(self, function)
        self.function = function
        self.starting_batch_size = starting_batch_size
        self.reduce_batch_size_fn = reduce_batch_size_fn
        self.max_batch_size = max_batch_size
        self.batch_size: int | None = None
        self.tries: list[tuple[int, bool]] = []

    def _check_call(self, args: tuple) -> None:
        try:
            params = list(inspect.signature(self.function).parameters.values())
        except (TypeError, ValueError):
            return
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            return
        if len(params) < len(args) + 1:
            name = getattr(self.function, "__name__", "function")
            raise TypeError(
                f"{name} received its batch size as an explicit argument, but find_executable_batch_size "
                f"passes it: call `{name}({', '.join(f'arg{i}' for i in range(1, len(params)))})` without "
                "the batch size."
            )

    def _attempt(self, batch_size: int, args: tuple, kwargs: dict[str, Any]) -> tuple[bool, Any]:
        logger.info(f"find_executable_batch_size: trying batch size {batch_size}")
        try:
            result = self.function(batch_size, *args, **kwargs)
        except Exception as exc:
            if not should_reduce_batch_size(exc):
                raise
            logger.warning(f"find_executable_batch_size: batch size {batch_size} ran out of memory.")
            failed = True
        else:
            failed = False
        # Collect only after the except block has dropped the exception and its frames' tensors.
        if failed:
            gc.collect()
            _empty_device_caches()
            return False, None
        return True, result

    def _next_size(self, size: int, ok: bool, best: int | None, worst: int | None) -> int | None:
        """Return the next batch size to try, or None when the search is over."""
        if self.reduce_batch_size_fn is not None:
            return None if ok else _call_reduce_fn(self.reduce_batch_size_fn, size)
        if best is None:
            return size // 2
        if worst is None:
            ceiling = self.max_batch_size
            return None if ceiling is None or best >= ceiling else min(best * 2, ceiling)
        return None if worst - best <= 1 else (best + worst) // 2

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function with the largest batch size that fits and return its result.

        Raises:
            TypeError: the caller passed the batch size too.
            RuntimeError: even batch size 1 ran out of memory (no executable batch size).
            Exception: any error that is not an out-of-memory error, unchanged.
        """
        self._check_call(args)
        self.tries = []
        size: int | None = self.starting_batch_size
        best: int | None = None
        worst: int | None = None
        result: Any = None
        while size is not None:
            if size <= 0:
                raise RuntimeError(
                    "find_executable_batch_size: no executable batch size found, reached zero "
                    f"after trying {[s for s, _ in self.tries]}. Reduce the model or sequence size, "
                    "or free memory held outside the function."
                )
            ok, outcome = self._attempt(size, args, kwargs)
            self.tries.append((size, ok))
            if ok and (best is None or size > best):
                best, result = size, outcome
            elif not ok and (worst is None or size < worst):
                worst = size
            size = self._next_size(size, ok, best, worst)
        self.batch_size = best
        logger.info(f"find_executable_batch_size: using batch size {best} ({len(self.tries)} tries)")
        return result

    def __str__(self) -> str:
        return str(self.batch_size) if self.batch_size is not None else repr(self)

    def __repr__(self) -> str:
        name = getattr(self.function, "__name__", "function")
        return f"<find_executable_batch_size({name}) batch_size={self.batch_size}>"


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[..., int] | None = None,
    *,
    max_batch_size: int | None = None,
) -> Any:
    """Retry a function with smaller batch sizes until it runs without running out of memory.

    Works as a decorator (``@find_executable_batch_size(starting_batch_size=64)``) or a function
    (``find_executable_batch_size(train, 64)``). The wrapped function must take the batch size as its
    first argument; call the wrapper without it. Build models and dataloaders inside the function so
    that each try starts clean.

    Search: the first size is ``starting_batch_size``. On an out-of-memory error the size is halved
    until a run succeeds; then it bisects between the largest success and the smallest failure and
    ends on the largest size that runs. With ``max_batch_size``, a first success doubles the size
    (up to that bound) before bisecting, so a too-small starting size is raised too. Every
    successful try runs the function to completion; the result of the largest one is returned.

    Args:
        function: the function to wrap (omit when used as ``@find_executable_batch_size(...)``).
        starting_batch_size: the first batch size tried.
        reduce_batch_size_fn: custom policy: called after each failure with the failed size (or with no
            argument) and returns the next size to try; the search stops at the first success.
        max_batch_size: allow growing above ``starting_batch_size`` up to this size.

    Returns:
        A :class:`BatchSizeFinder` (or, without ``function``, a decorator producing one). Its
        ``batch_size`` attribute holds the size found once it has been called.

    Raises:
        ValueError: a starting or maximum batch size that is not a positive int.

    Example:
        >>> @find_executable_batch_size(starting_batch_size=128)
        ... def train(batch_size, model_name):
        ...     ...
        >>> train("tiny")  # runs with the largest batch size that fits; train.batch_size holds it
    """
    for label, value in (("starting_batch_size", starting_batch_size), ("max_batch_size", max_batch_size)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{label} must be a positive int, got {value!r}.")
    if max_batch_size is not None and max_batch_size < starting_batch_size:
        raise ValueError(
            f"max_batch_size ({max_batch_size}) is below starting_batch_size ({starting_batch_size}); "
            "raise it or leave it unset."
        )
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
            max_batch_size=max_batch_size,
        )
    if not callable(function):
        raise TypeError(f"find_executable_batch_size needs a callable, got {type(function).__name__}.")
    return BatchSizeFinder(function, starting_batch_size, reduce_batch_size_fn, max_batch_size)
