"""DistributedDataParallel: every process holds the whole model; gradients are all-reduced."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from accelerando.backends.precision.base import Precision
from accelerando.backends.strategies.base import ReplicatesParameters, Strategy
from accelerando.core.runtime import Runtime
from accelerando.plugins.kwargs import DistributedDataParallelKwargs

if TYPE_CHECKING:
    from torch.distributed.algorithms.join import Joinable

__all__ = ["DDPStrategy"]


class DDPStrategy(ReplicatesParameters, Strategy):
    """Wrap trainable models in ``torch.nn.parallel.DistributedDataParallel``.

    Options: ``ddp_kwargs`` (a ``DistributedDataParallelKwargs`` or None).
    The distributed type is whatever the runtime reports (MULTI_CPU, MULTI_GPU, ...).
    """

    name = "ddp"

    def __init__(
        self,
        runtime: Runtime,
        precision: Precision,
        *,
        ddp_kwargs: DistributedDataParallelKwargs | None = None,
        **options: object,
    ) -> None:
        super().__init__(runtime, precision, **options)
        self.distributed_type = runtime.distributed_type
        self.ddp_kwargs = ddp_kwargs

    @override
    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        model = super().prepare_model(model, device_placement, evaluation_mode)
        # A model with nothing to train (a frozen teacher, an evaluation-only model) gains nothing
        # from DDP and DDP refuses it; leave it plain.
        if evaluation_mode or not any(p.requires_grad for p in model.parameters()):
            return model
        from torch.nn.parallel import DistributedDataParallel

        kwargs = self.ddp_kwargs.ddp_kwargs() if self.ddp_kwargs is not None else {}
        device = self.runtime.device
        device_ids = [device.index if device.index is not None else 0] if device.type != "cpu" else None
        wrapped = DistributedDataParallel(
            model, device_ids=device_ids, output_device=device_ids[0] if device_ids else None, **kwargs
        )
        if self.ddp_kwargs is not None:
            self.ddp_kwargs.register_comm_hook(wrapped)
        return wrapped

    @override
    def replica_parameters(self, model: torch.nn.Module) -> Iterator[torch.nn.Parameter]:
        return self.unwrap_model(model).parameters()

    @override
    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        # DDP decides whether to all-reduce from these two flags when the forward runs; setting them
        # and re-arming the reducer makes the next backward synchronise inside a no_sync block.
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            yield
            return
        old_grad, old_param = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = old_grad, old_param

    @override
    def join_uneven_inputs(
        self, joinables: list[Joinable], even_batches: bool | None = None
    ) -> contextlib.AbstractContextManager[object]:
        from torch.distributed.algorithms.join import Join

        return Join(joinables)
