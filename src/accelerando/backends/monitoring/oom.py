"""Out-of-memory helpers: retry a function with smaller batch sizes, free memory, recognise OOM errors.

:func:`find_executable_batch_size` keeps the reference's contract, because libraries built on it
(transformers' ``auto_find_batch_size``) wrap their whole training loop in it:

- the wrapped function receives the batch size as its first argument; the wrapper returns its result;
- on an out-of-memory error the size becomes ``int(size * 0.9)`` (128, 115, 103, 92, ...) and the
  function is called again; any other error propagates unchanged;
- the first call that returns ends the search, so the function *completes exactly once*: it is
  never re-run after a success (no growing, no bisecting);
- reaching zero raises ``RuntimeError("No executable batch size found, reached zero.")``.

Other policies are opt-in through ``reduce_batch_size_fn`` (for example halving:
``reduce_batch_size_fn=lambda size: size // 2``); they only choose the next, smaller size after a
failure and never re-run after a success either. Beyond the reference, the wrapper keeps the size that
ran (``.batch_size``) and the sizes tried (``.tries``), and logs the size it settled on.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Concatenate, Generic, ParamSpec, TypeVar, overload

import torch

from accelerando.core.devices import DEVICE_BACKENDS
from accelerando.logging import get_logger

__all__ = ["BatchSizeFinder", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"]

logger = get_logger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

#: The reference's step after an out-of-memory error: the next size is ``int(size * REDUCTION)``.
REDUCTION = 0.9

# Substrings of the RuntimeError messages each allocator raises when it runs out of memory.
# " out of memory." covers "CPU/CUDA/XPU/NPU/HIP/HPU out of memory." and the like.
_OOM_MESSAGES = (
    " out of memory.",
    "CUDA error: out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",  # cuDNN's answer to a too-large workspace request
    "DefaultCPUAllocator: can't allocate memory",
    "MPS backend out of memory",
)

_REACHED_ZERO = "No executable batch size found, reached zero."


def _empty_device_caches() -> None:

    for backend in DEVICE_BACKENDS:
        # An uninitialised CUDA runtime holds no cache; touching it would only initialise it.
        if backend.name == "cuda" and not torch.cuda.is_initialized():
            continue
        try:
            backend.empty_cache()
        except (RuntimeError, AttributeError):
            continue


def _collect() -> None:
    gc.collect()
    _empty_device_caches()


def release_memory(*objects: object) -> list[None]:
    """Drop references to ``objects``, run the garbage collector and empty device caches.

    Rebind the names yourself with the returned list, since a function cannot delete its caller's
    variables::

        model, optimizer = release_memory(model, optimizer)

    Args:
        *objects: the objects to release.

    Returns:
        A list of ``None``, one per object.

    Example:
        >>> import torch
        >>> from accelerando.utils import release_memory
        >>> model = torch.nn.Linear(4, 2)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> model, optimizer = release_memory(model, optimizer)
        >>> model is None
        True
    """
    released: list[None] = [None for _ in objects]
    del objects
    _collect()
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Tell whether ``exception`` is an out-of-memory error that a smaller batch might avoid.

    Recognises the out-of-memory ``RuntimeError`` messages of the allocators (``"CPU out of memory."``,
    ``"CUDA out of memory."``, XPU, NPU, HIP, MPS, cuDNN's workspace refusal, the CPU allocator's
    ``"can't allocate memory"``), ``torch.OutOfMemoryError`` and Python's ``MemoryError``.

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


def _reduce(batch_size: int, reduce_fn: Callable[..., int] | None) -> int:
    """Return the size to try after ``batch_size`` ran out of memory."""
    if reduce_fn is None:
        return int(batch_size * REDUCTION)
    # The reference calls the policy without arguments; ours may also take the size that failed.
    try:
        takes_argument = len(inspect.signature(reduce_fn).parameters) > 0
    except (TypeError, ValueError):
        takes_argument = False
    new_size = reduce_fn(batch_size) if takes_argument else reduce_fn()
    if not isinstance(new_size, int) or isinstance(new_size, bool):
        raise TypeError(f"reduce_batch_size_fn must return an int batch size, got {new_size!r}.")
    return new_size


class BatchSizeFinder(Generic[P, R]):
    """The wrapper returned by :func:`find_executable_batch_size`; call it like the wrapped function.

    Each call runs the search from ``starting_batch_size`` again and ends at the first success.

    Attributes:
        batch_size: the batch size the last call completed with (``None`` before a successful call).
        tries: ``(batch_size, succeeded)`` for every attempt of the last call, in order; only the last
            entry can be a success.
    """

    def __init__(
        self,
        function: Callable[Concatenate[int, P], R],
        starting_batch_size: int,
        reduce_batch_size_fn: Callable[..., int] | None,
    ) -> None:
        functools.update_wrapper(self, function)
        self.function = function
        self.starting_batch_size = starting_batch_size
        self.reduce_batch_size_fn = reduce_batch_size_fn
        self.batch_size: int | None = None
        self.tries: list[tuple[int, bool]] = []

    def _check_call(self, args: tuple) -> None:
        """Refuse a call that passes the batch size itself (one positional argument too many)."""
        try:
            params = list(inspect.signature(self.function).parameters.values())
        except (TypeError, ValueError):
            return
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            return
        if len(params) < len(args) + 1:
            name = getattr(self.function, "__name__", "function")
            shown = ", ".join(f"{p.name}={value!r}" for p, value in zip(params[1:], args[1:], strict=False))
            raise TypeError(
                f"Batch size was passed into `{name}` as the first argument when called. Remove this as "
                f"the decorator already does so: `{name}({shown})`"
            )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function, retrying with smaller batch sizes after out-of-memory errors.

        Returns:
            The result of the first call that did not run out of memory.

        Raises:
            TypeError: the caller passed the batch size too, or ``reduce_batch_size_fn`` returned a
                non-int.
            RuntimeError: the batch size reached zero (no executable batch size).
            Exception: any error that is not an out-of-memory error, unchanged.
        """
        self._check_call(args)
        self.tries = []
        self.batch_size = None
        batch_size = self.starting_batch_size
        _collect()  # start from a clean allocator, as the reference does
        while True:
            if batch_size <= 0:
                raise RuntimeError(
                    f"{_REACHED_ZERO} Tried {[size for size, _ in self.tries]}: reduce the model or "
                    "sequence size, or free memory held outside the function."
                )
            try:
                result = self.function(batch_size, *args, **kwargs)
            except Exception as exc:
                if not should_reduce_batch_size(exc):
                    raise
                logger.info(f"find_executable_batch_size: batch size {batch_size} ran out of memory.")
                self.tries.append((batch_size, False))
            else:
                self.tries.append((batch_size, True))
                self.batch_size = batch_size
                logger.info(f"find_executable_batch_size: ran with batch size {batch_size}.")
                return result
            # Outside the except block: the exception and its frames' tensors are gone by now.
            _collect()
            batch_size = _reduce(batch_size, self.reduce_batch_size_fn)

    def __str__(self) -> str:
        return str(self.batch_size) if self.batch_size is not None else repr(self)

    def __repr__(self) -> str:
        name = getattr(self.function, "__name__", "function")
        return f"<find_executable_batch_size({name}) batch_size={self.batch_size}>"


@overload
def find_executable_batch_size(
    function: Callable[Concatenate[int, P], R],
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[..., int] | None = None,
) -> BatchSizeFinder[P, R]: ...


@overload
def find_executable_batch_size(
    function: None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[..., int] | None = None,
) -> Callable[[Callable[Concatenate[int, P], R]], BatchSizeFinder[P, R]]: ...


def find_executable_batch_size(
    function: Callable[Concatenate[int, P], R] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[..., int] | None = None,
) -> BatchSizeFinder[P, R] | Callable[[Callable[Concatenate[int, P], R]], BatchSizeFinder[P, R]]:
    """Retry a function with smaller batch sizes until it runs without running out of memory.

    Works as a decorator (``@find_executable_batch_size(starting_batch_size=64)``) or a function
    (``find_executable_batch_size(train, 64)``). The wrapped function must take the batch size as its
    first argument; call the wrapper without it. Build models and dataloaders inside the function so
    that each try starts clean.

    The first size is ``starting_batch_size``; after each out-of-memory error the next is
    ``int(size * 0.9)``, or what ``reduce_batch_size_fn`` returns. The first call that returns ends
    the search: the function completes exactly once, so it may be a whole training loop.

    Args:
        function: the function to wrap (omit when used as ``@find_executable_batch_size(...)``).
        starting_batch_size: the first batch size tried.
        reduce_batch_size_fn: the next size after an out-of-memory error, instead of ``int(size * 0.9)``.
            Called without arguments (as in the reference) or, if it takes one, with the size that
            failed, e.g. ``lambda size: size // 2`` to halve.

    Returns:
        A :class:`BatchSizeFinder` (or, without ``function``, a decorator producing one). Its
        ``batch_size`` attribute holds the size the last call completed with.

    Raises:
        TypeError: ``function`` is not callable or ``starting_batch_size`` is not an int.

    Example:
        >>> from accelerando import find_executable_batch_size
        >>> @find_executable_batch_size(starting_batch_size=128)
        ... def train(batch_size, model_name):
        ...     if batch_size > 32:  # stands for the out-of-memory error a real step raises
        ...         raise RuntimeError("CUDA out of memory.")
        ...     return f"{model_name} trained with batch size {batch_size}"
        >>> train("tiny")  # tries 128, 115, 103, ... and returns from the first size that fits
        'tiny trained with batch size 32'
        >>> train.batch_size
        32
    """
    if not isinstance(starting_batch_size, int) or isinstance(starting_batch_size, bool):
        raise TypeError(f"starting_batch_size must be an int, got {starting_batch_size!r}.")
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    if not callable(function):
        raise TypeError(f"find_executable_batch_size needs a callable, got {type(function).__name__}.")
    return BatchSizeFinder(function, starting_batch_size, reduce_batch_size_fn)
