"""Accelerator methods that talk across processes or restrict work to some processes."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["CollectivesMixin"]

F = TypeVar("F", bound=Callable[..., Any])


def _all_tensors(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, (list, tuple)):
        return len(data) > 0 and all(_all_tensors(d) for d in data)
    if isinstance(data, dict):
        return len(data) > 0 and all(_all_tensors(v) for v in data.values())
    return False


def _batch_copies(mesh: Any) -> tuple[int, bool]:
    """How many ranks read each batch (the product of the mesh's non-data axes), and whether this
    rank is the first of them (rank 0 along each of those axes)."""
    if mesh is None:
        return 1, True
    copies, first = 1, True
    for axis, name in enumerate(getattr(mesh, "mesh_dim_names", None) or ()):
        if name in ("tp", "cp", "sp", "pp"):
            copies *= int(mesh.size(axis))
            first = first and int(mesh.get_local_rank(name)) == 0
    return copies, first


class CollectivesMixin:
    """gather / reduce / padding / process filters. Needs ``self.state`` and ``self.gradient_state``."""

    state: Any
    gradient_state: Any

    # ------------------------------------------------------------ collectives
    def gather(self, tensor: Any) -> Any:
        """Concatenate ``tensor`` (or a nested structure of tensors) from every process along dim 0.

        Raises:
            ValueError: shapes differ across processes (use ``pad_across_processes`` first).
        """
        from accelerando.common.operations import gather

        return gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather for evaluation, dropping the samples duplicated to even out the last batch.

        Works for tensors in any nesting and, through ``gather_object``, for other picklable objects
        (then a flat list comes back). On the last batch of a prepared dataloader whose dataset did
        not divide evenly, only the first ``GradientState().remainder`` gathered samples are real;
        the rest are dropped so the result has exactly ``len(dataset)`` items over the epoch, in
        dataset order. This holds on one process too: a value repeated to the full batch size on
        the last, short batch (as ``transformers.Trainer`` does with the loss) is cut to the real
        count.
        With a device mesh, ranks that differ only along tensor/context axes read the same batches:
        only the first of them contributes, so no sample is counted twice.
        """
        from accelerando.common.operations import gather, gather_object, recursively_apply

        use_object = use_gather_object or not _all_tensors(input_data)
        copies, first_copy = _batch_copies(self.state.device_mesh)
        if copies > 1 and not first_copy:
            input_data = [] if use_object else recursively_apply(lambda t: t[:0], input_data)
        if use_object:
            data = gather_object(input_data)
        elif (getattr(self, "even_batches", True) and copies == 1) or not self.state.use_distributed:
            data = gather(input_data)
        else:
            data = self._gather_ragged(input_data)
        gs = self.gradient_state
        if not gs.end_of_dataloader:
            return data
        remainder = gs.remainder
        if remainder <= 0:  # unknown (-1), or the data divided evenly (0): nothing was added
            return data
        if use_object:
            return data[:remainder]
        return recursively_apply(lambda t: t[:remainder], data)

    def _gather_ragged(self, data: Any) -> Any:
        """Gather tensors whose first dimension differs across processes (uneven last batches)."""
        from accelerando.common.operations import (
            find_batch_size,
            gather,
            pad_across_processes,
            recursively_apply,
        )

        local = torch.tensor([find_batch_size(data)], device=self.state.device)
        sizes = gather(local).tolist()
        padded = gather(pad_across_processes(data, dim=0))
        width = max(sizes)

        def pick(tensor: torch.Tensor) -> torch.Tensor:
            return torch.cat([tensor[i * width : i * width + n] for i, n in enumerate(sizes)])

        return recursively_apply(pick, padded)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce ``tensor`` across processes ("sum", "mean" or None), times ``scale``."""
        from accelerando.common.operations import reduce

        return reduce(tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        """Pad ``tensor`` along ``dim`` to the largest size any process has, so it can be gathered."""
        from accelerando.common.operations import pad_across_processes

        return pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Any:
        """Context manager yielding this process's share of ``inputs`` (see ``PartialState``)."""
        return self.state._partial.split_between_processes(inputs, apply_padding=apply_padding)

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        self.state._partial.wait_for_everyone()

    # ------------------------------------------------------------- triggers
    def set_trigger(self) -> None:
        """Raise a flag on this process; ``check_trigger`` on every process then sees it."""
        self._trigger_flag = torch.ones(1, device=self.state.device)

    def check_trigger(self) -> bool:
        """Return True on every process when any process called ``set_trigger``; resets the flag."""
        flag = getattr(self, "_trigger_flag", None)
        if flag is None:
            flag = torch.zeros(1, device=self.state.device)
        total = self.reduce(flag, reduction="sum")
        self._trigger_flag = None
        return bool(total.item() >= 1)

    # ------------------------------------------------------- process filters
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine."""
        self.state._partial.print(*args, **kwargs)

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context: the main process runs the block before the others."""
        return self.state._partial.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context: each machine's first process runs the block before the others."""
        return self.state._partial.local_main_process_first()

    # Each filter also works unbound on a function (``Accelerator.on_main_process(fn)``, the
    # reference's way of decorating its own methods) and called (``@accelerator.on_main_process()``).
    def on_main_process(self, function: Callable[..., Any] | None = None) -> Any:
        """Decorator: run only on the main process (bare, called, or unbound on the class)."""
        return _filter(self, function, "on_main_process")

    def on_local_main_process(self, function: Callable[..., Any] | None = None) -> Any:
        """Decorator: run only on each machine's first process (bare, called, or unbound)."""
        return _filter(self, function, "on_local_main_process")

    def on_last_process(self, function: Callable[..., Any] | None = None) -> Any:
        """Decorator: run only on the last process (bare, called, or unbound)."""
        return _filter(self, function, "on_last_process")

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        """Decorator: run only on process ``process_index`` (``@accelerator.on_process(process_index=1)``)."""
        return _filter(self, function, "on_process", process_index=process_index)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run only on local process ``local_process_index``."""
        return _filter(self, function, "on_local_process", local_process_index=local_process_index)


def _filter(owner: Any, function: Callable[..., Any] | None, name: str, **index: Any) -> Any:
    """Apply ``PartialState``'s filter ``name`` to ``function`` (or return it as a decorator).

    ``owner`` is the Accelerator, or the function itself when the filter is called unbound on the
    class. The process state is looked up when the function runs, so decorating needs no state.
    """
    from accelerando.state import PartialState

    if not isinstance(owner, CollectivesMixin):
        function = owner
    elif function is None:
        return functools.partial(_filter, owner, **index, name=name) if index else getattr(owner, name)
    if index and next(iter(index.values())) is None:
        raise ValueError(f"{name} needs {next(iter(index))}=<index of the process that runs it>")

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        return getattr(PartialState(), name)(function, **index)(*args, **kwargs)

    return run
