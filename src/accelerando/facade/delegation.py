"""One-line delegations from the Accelerator to the services it composes.

``gather = delegate("_collectives", Collectives.gather)`` makes ``Accelerator.gather`` call
``self._collectives.gather(...)``; ``device = forwarded("state.device", "...")`` makes a property
reading ``self.state.device``. Both keep the service's signature and docstring visible
(``inspect.signature``, ``help``), so the Accelerator's public surface reads as before.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

__all__ = ["delegate", "forwarded"]

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


def delegate(service: str, method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[object, P], R]:
    """A method calling ``method`` on the service held in the attribute named ``service``.

    The result carries ``method``'s name, docstring and signature (through ``__wrapped__``).
    """
    get_service = operator.attrgetter(service)

    @functools.wraps(method)
    def call(self: object, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(get_service(self), *args, **kwargs)

    return call


def forwarded(path: str, doc: str, writable: bool = False) -> property:
    """A property reading the dotted attribute ``path`` of its object (and writing it when ``writable``).

    Example:
        ``num_processes = forwarded("state.num_processes", "Total number of processes.")``
    """
    owner_path, _, name = path.rpartition(".")
    get_owner = operator.attrgetter(owner_path)

    def write(self: object, value: object) -> None:
        setattr(get_owner(self), name, value)

    return property(operator.attrgetter(path), write if writable else None, doc=doc)
