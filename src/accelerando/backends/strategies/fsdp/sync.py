"""Turning FSDP2's gradient reduction off and on around backwards, for gradient accumulation.

Shared by the FSDP strategy and the composable (tensor parallel x FSDP2) strategy: both shard
with FSDP2 ``fully_shard`` and accumulate the same way. FSDP1 modules (a wrapper with its own
``no_sync``) are the FSDP strategy's business, not this module's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

__all__ = ["FSDP2GradientSync", "is_fsdp2"]


def is_fsdp2(model: object) -> TypeGuard[FSDPModule]:
    """Whether ``model`` was sharded by FSDP2 ``fully_shard`` (an ``FSDPModule``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


class FSDP2GradientSync:
    """The two accumulation contexts over FSDP2 models; anything else passes through untouched.

    One instance per strategy. It remembers which models are inside :meth:`no_sync`, so that a
    :meth:`trigger_sync_in_backward` nested in it turns reduction back off when it ends.

    Example:
        >>> sync = FSDP2GradientSync()
        >>> with sync.no_sync(model):  # doctest: +SKIP
        ...     loss.backward()  # gradients stay local, no reduce-scatter
    """

    def __init__(self) -> None:
        self._unsynced: set[int] = set()  # ids of FSDP2 models inside no_sync

    @contextlib.contextmanager
    def no_sync(self, model: object) -> Iterator[None]:
        """Accumulate gradients locally: backwards inside skip FSDP2's reduce-scatter.

        Reduction is turned back on when the context ends (also on an exception). A model that is
        not FSDP2 is left as it is.
        """
        if not is_fsdp2(model):
            yield
            return
        model.set_requires_gradient_sync(False)
        self._unsynced.add(id(model))
        try:
            yield
        finally:
            self._unsynced.discard(id(model))
            model.set_requires_gradient_sync(True)

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: object) -> Iterator[None]:
        """Force backwards inside this context to reduce gradients, even within :meth:`no_sync`.

        When it ends inside :meth:`no_sync`, reduction is turned off again. A model that is not
        FSDP2 is left as it is.
        """
        if not is_fsdp2(model):
            yield
            return
        model.set_requires_gradient_sync(True)
        try:
            yield
        finally:
            if id(model) in self._unsynced:
                model.set_requires_gradient_sync(False)
