"""Talking across processes for one Accelerator: gather / reduce / padding / triggers / process filters."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from typing import TypeVar, cast

import torch

import accelerando.common as common
from accelerando.facade.context import ServiceContext
from accelerando.state import PartialState

__all__ = ["Collectives", "process_filter"]

F = TypeVar("F", bound=Callable[..., object])
# The collectives give back data of the shape they were given (a tensor, a tuple of tensors, a dict
# of them): typed as pass-throughs, so ``accelerator.gather(out).shape`` type-checks for the user.
# (``gather_for_metrics`` of non-tensor objects over several processes returns the flat list of every
# process's items, as the reference does: the one case the annotation does not describe.)
_Data = TypeVar("_Data")


def _all_tensors(data: object) -> bool:
    """Whether every leaf of ``data`` is a tensor (empty containers included), as the reference
    decides between ``gather`` and ``gather_object``.
    """
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, (list, tuple)):
        return all(_all_tensors(d) for d in data)
    if isinstance(data, Mapping):
        return all(_all_tensors(v) for v in data.values())
    return False


def _has_scalar(data: object) -> bool:
    """Whether a 0-d tensor is among the tensors of ``data`` (it has no samples to count or cut)."""
    found: list[bool] = []
    common.operations.recursively_apply(lambda t: found.append(t.ndim == 0), data)
    return any(found)


def _first_samples(data: object, remainder: int, use_object: bool) -> object:
    """The first ``remainder`` samples of gathered ``data``; ``data`` whole where it has no samples
    to cut, as the reference returns it: an object that cannot be sliced (a number, a dict), or
    tensors among which one is 0-d (a count, a mean loss).
    """
    if use_object:
        try:
            return data[:remainder]  # type: ignore[index]
        except (TypeError, IndexError, KeyError):
            return data
    if _has_scalar(data):
        return data
    return common.operations.recursively_apply(lambda t: t[:remainder], data)


def _batch_copies(mesh: object) -> tuple[int, bool]:
    """How many ranks read each batch (the product of the mesh's non-data axes), and whether this
    rank is the first of them (rank 0 along each of those axes).
    """
    if mesh is None:
        return 1, True
    copies, first = 1, True
    for axis, name in enumerate(getattr(mesh, "mesh_dim_names", None) or ()):
        if name in ("tp", "cp", "sp", "pp"):
            copies *= int(mesh.size(axis))  # type: ignore[attr-defined]
            first = first and int(mesh.get_local_rank(name)) == 0  # type: ignore[attr-defined]
    return copies, first


class Collectives:
    """gather / reduce / padding / triggers / process-ordering contexts of one Accelerator.

    Args:
        context: the Accelerator's shared services record: the process view (device, process
            group), the mesh (``gather_for_metrics`` counts each batch once), the accumulation state
            (where the last batch of a dataloader ends) and the options (``even_batches``).

    Attributes:
        flag_tensor: the flag ``set_trigger`` raised on this process, or None.
    """

    def __init__(self, context: ServiceContext) -> None:
        self.context = context
        self.state = context.state
        self.gradient_state = context.gradient_state
        self.options = context.options
        self.flag_tensor: torch.Tensor | None = None

    def gather(self, tensor: _Data) -> _Data:
        """Concatenate ``tensor`` (or a nested structure of tensors) from every process along dim 0.

        Raises:
            ValueError: shapes differ across processes (use ``pad_across_processes`` first).

        Example:
            >>> accelerator.gather(torch.tensor([accelerator.process_index]))  # on 2 processes: tensor([0, 1])
            tensor([0])
        """
        return cast(_Data, common.operations.gather(tensor))

    def gather_for_metrics(self, input_data: _Data, use_gather_object: bool = False) -> _Data:
        """Gather for evaluation, dropping the samples duplicated to even out the last batch.

        Works for tensors in any nesting and, through ``gather_object``, for other picklable objects
        (then, with several processes, the flat list of every process's items; in one, the object
        itself). On the last batch of a prepared dataloader whose dataset did
        not divide evenly, only the first ``GradientState().remainder`` gathered samples are real;
        the rest are dropped so the result has exactly ``len(dataset)`` items over the epoch, in
        dataset order. This holds on one process too: a value repeated to the full batch size on
        the last, short batch (as ``transformers.Trainer`` does with the loss) is cut to the real
        count. Data with nothing to cut comes back whole there, as the reference returns it: a 0-d
        tensor anywhere in it (a token count, a mean loss), or an object that cannot be sliced.
        With a device mesh, ranks that differ only along tensor/context axes read the same batches:
        only the first of them contributes, so no sample is counted twice.

        Example:
            >>> predictions = []
            >>> with torch.no_grad():
            ...     for batch, target in dataloader:
            ...         predictions.append(accelerator.gather_for_metrics(model(batch)))
            >>> len(torch.cat(predictions))  # one row per sample of the dataset, on any number of processes
            8
        """
        use_object = use_gather_object or not _all_tensors(input_data)
        copies, first_copy = _batch_copies(self.context.mesh)
        if copies > 1 and not first_copy and (use_object or not _has_scalar(input_data)):
            input_data = cast(
                _Data, [] if use_object else common.operations.recursively_apply(lambda t: t[:0], input_data)
            )
        data: object
        if use_object:
            data = common.operations.gather_object(input_data)
        elif not self.state.use_distributed or _has_scalar(input_data):
            data = common.operations.gather(input_data)
        elif self.options.dataloader_config.even_batches and copies == 1:
            data = common.operations.gather(input_data)
        else:
            data = self._gather_ragged(input_data)
        gs = self.gradient_state
        if not gs.end_of_dataloader or gs.remainder <= 0:
            # Not the last batch; or the duplicates are unknown (-1: no length) or none (0).
            return cast(_Data, data)
        return cast(_Data, _first_samples(data, gs.remainder, use_object))

    def _gather_ragged(self, data: object) -> object:
        """Gather tensors whose first dimension differs across processes (uneven last batches)."""
        local = torch.tensor([common.operations.find_batch_size(data)], device=self.state.device)
        sizes = common.operations.gather(local).tolist()
        padded = common.operations.gather(common.operations.pad_across_processes(data, dim=0))
        width = max(sizes)

        def pick(tensor: torch.Tensor) -> torch.Tensor:
            return torch.cat([tensor[i * width : i * width + n] for i, n in enumerate(sizes)])

        return common.operations.recursively_apply(pick, padded)

    def reduce(self, tensor: _Data, reduction: str = "sum", scale: float = 1.0) -> _Data:
        """Reduce ``tensor`` across processes ("sum", "mean" or None), times ``scale``.

        Example:
            >>> accelerator.reduce(torch.tensor([1.0, 2.0]), reduction="sum")  # on 2 processes: tensor([2., 4.])
            tensor([1., 2.])
        """
        return cast(_Data, common.operations.reduce(tensor, reduction, scale))

    def pad_across_processes(
        self, tensor: _Data, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> _Data:
        """Pad ``tensor`` along ``dim`` to the largest size any process has, so it can be gathered.

        Example:
            >>> lengths = torch.ones(accelerator.process_index + 2)  # 2 and 3 items on 2 processes
            >>> accelerator.pad_across_processes(lengths).shape  # on 2 processes: torch.Size([3]) on each
            torch.Size([2])
        """
        return cast(
            _Data,
            common.operations.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first),
        )

    def split_between_processes(
        self, inputs: _Data, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[_Data]:
        """Context manager yielding this process's share of ``inputs`` (see ``PartialState``).

        Example:
            >>> with accelerator.split_between_processes(["a", "b", "c"]) as mine:
            ...     print(mine)  # on 2 processes: ['a', 'b'] on process 0, ['c'] on process 1
            ['a', 'b', 'c']
        """
        return self.state._partial.split_between_processes(inputs, apply_padding=apply_padding)

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point.

        Example:
            >>> accelerator.wait_for_everyone()  # e.g. before the main process reads what every process wrote
        """
        self.state._partial.wait_for_everyone()

    def set_trigger(self) -> None:
        """Raise a flag on this process; ``check_trigger`` on every process then sees it.

        Example:
            >>> accelerator.set_trigger()  # e.g. when this process's loss became NaN
            >>> accelerator.check_trigger()  # every process sees it, and the flag is reset
            True
        """
        self.flag_tensor = torch.ones(1, device=self.state.device)

    def check_trigger(self) -> bool:
        """Return True on every process when any process called ``set_trigger``; resets the flag.

        Example:
            >>> loss = torch.tensor(float("nan"))
            >>> if torch.isnan(loss):
            ...     accelerator.set_trigger()
            >>> if accelerator.check_trigger():  # True on every process
            ...     print("stopping early")
            stopping early
        """
        flag = self.flag_tensor
        if flag is None:
            flag = torch.zeros(1, device=self.state.device)
        total = common.operations.reduce(flag, "sum", 1.0)
        self.flag_tensor = None
        return bool(total.item() >= 1)

    def print(self, *args: object, **kwargs: object) -> None:
        """``print`` once per machine.

        Example:
            >>> accelerator.print("epoch 1 done")  # once, not once per process
            epoch 1 done
        """
        self.state._partial.print(*args, **kwargs)

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context: the main process runs the block before the others.

        Example:
            >>> with accelerator.main_process_first():
            ...     data = list(range(8))  # e.g. preprocess once, the others then read the cache
        """
        return self.state._partial.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context: each machine's first process runs the block before the others.

        Example:
            >>> with accelerator.local_main_process_first():
            ...     data = list(range(8))  # e.g. download and cache a dataset once per machine
        """
        return self.state._partial.local_main_process_first()


def process_filter(function: F, name: str, **index: int | None) -> F:
    """Wrap ``function`` so that it runs only where ``PartialState``'s filter ``name`` says.

    The process state is looked up when the function runs, so decorating needs no state.

    Raises:
        ValueError: the filter takes an index (``process_index``...) and it was not given.
    """
    if index and next(iter(index.values())) is None:
        raise ValueError(f"{name} needs {next(iter(index))}=<index of the process that runs it>")

    @functools.wraps(function)
    def run(*args: object, **kwargs: object) -> object:
        return getattr(PartialState(), name)(function, **index)(*args, **kwargs)

    return run  # type: ignore[return-value]
