"""Small pieces the state views share: the per-thread shared dict, the no-op, the read-only error."""

from __future__ import annotations

import threading

import accelerando.core.runtime as runtime
from accelerando.core.settings import environment_text

__all__ = [
    "ThreadLocalSharedDict",
    "do_nothing",
    "fork_launched",
    "is_initialized",
    "missing_attribute",
    "view_is_read_only",
]

_TRUE = ("1", "true", "yes", "on", "y")


class ThreadLocalSharedDict(threading.local):
    """A class-level dictionary that each thread sees separately (a descriptor).

    Put it as a class attribute (``_shared_state = ThreadLocalSharedDict()``): reading the attribute,
    from the class or an instance, gives the calling thread's own dict; assigning it replaces that
    thread's dict. Used instead of a plain dict where each thread stands for one device (XLA's
    threads-as-processes model), so that a Borg state is shared inside a thread only.

    Args:
        thread_local: kept for signature compatibility; the storage is always per thread.
    """

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[str, object] = {}

    def __get__(self, obj: object, objtype: type | None = None) -> dict[str, object]:
        return self._storage

    def __set__(self, obj: object, value: dict[str, object]) -> None:
        self._storage = value


def do_nothing(*args: object, **kwargs: object) -> None:
    """Accept any arguments and return None (what a process filter runs on the other processes)."""
    return None


def is_initialized() -> bool:
    """Whether the process state (``PartialState``) exists in this process."""
    return runtime.current_process() is not None


def fork_launched() -> bool:
    """Whether the processes were started by forking (the notebook launcher sets ``FORK_LAUNCHED``)."""
    return (environment_text("FORK_LAUNCHED") or "0").strip().lower() in _TRUE


def missing_attribute(owner: str, name: str, *, after_reset: bool) -> AttributeError:
    """The error for an attribute a state view cannot give.

    Args:
        owner: the view's class name (``"PartialState"``, ``"AcceleratorState"``).
        name: the attribute asked for.
        after_reset: the attribute is one of the state's and the state was reset (``_reset_state()``)
            without being created again: the message says so, and how to fix it.
    """
    if after_reset:
        return AttributeError(
            f"`{owner}` object has no attribute `{name}`. This happens if `{owner}._reset_state()` was "
            "called and an `Accelerator` or `PartialState` was not reinitialized."
        )
    return AttributeError(f"'{owner}' object has no attribute '{name}'")


def view_is_read_only(owner: str, name: str) -> AttributeError:
    """The error raised when code assigns an attribute that a state view only reads."""
    return AttributeError(
        f"{owner}.{name} is a read-only view of what the Accelerator decided; pass the value to "
        f"Accelerator(...) (or set it through the launcher / config file) instead of assigning it"
    )
