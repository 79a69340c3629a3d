"""Count what one rank holds and sends during a training step: live tensor bytes and collective bytes.

Memory is counted by torch's dispatch-mode trackers (``torch.distributed._tools``): ``MemTracker`` for a
plain or DDP model, ``FSDPMemTracker`` for an FSDP2 model. Both follow every tensor storage created
while they are active (weak references tell them when it is freed), so "peak" here means the largest
sum of live tensor storage bytes on the rank at any moment of the step. It is the same number for fake
tensors (a simulation) and for real ones (a measured run on CPU, which has no allocator peak statistic).
It leaves out what an accelerator adds on top: allocator rounding and fragmentation, the CUDA context,
NCCL buffers, kernels' workspaces. The plan's headroom is there for those.

Collectives are counted by :class:`CollectiveCounter`, another dispatch mode that sees every ``c10d``
and functional collective op. The bytes of one collective are those of its largest buffer: the whole
tensor of an all-reduce or broadcast, the gathered output of an all-gather, the unreduced input of a
reduce-scatter (the sizes a ring algorithm's cost is proportional to).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

# torch 2.13: torch/utils/_python_dispatch.py:72 (private; base of the collective-counting dispatch mode)
from torch.utils._python_dispatch import TorchDispatchMode

# torch 2.13: torch/utils/_pytree.py:1521 (private; the tensors among an op's arguments)
from torch.utils._pytree import tree_leaves

from accelerando.backends.planning.spec import MemoryBreakdown

if TYPE_CHECKING:
    # torch 2.13: torch/_ops.py:806, torch/distributed/_tools/mem_tracker.py:324 (private; annotations only)
    from torch._ops import OpOverload
    from torch.distributed._tools.mem_tracker import MemTracker

__all__ = ["CollectiveCounter", "memory_tracker", "tracked_breakdown"]

_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
_KINDS = (
    ("reduce_scatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("all_gather", "all_gather"),
    ("allreduce", "all_reduce"),
    ("all_reduce", "all_reduce"),
    ("broadcast", "broadcast"),
    ("all_to_all", "all_to_all"),
    ("alltoall", "all_to_all"),
)
# Categories of torch's trackers (their enum values) -> ours; anything unlisted is a temporary.
_CATEGORY_OF = {
    "Parameter": "parameters",
    "Buffer": "parameters",
    "Sharded Param": "parameters",
    "Unsharded Param": "parameters",
    "Gradient": "gradients",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "Optstate": "optimizer",
    "OptState": "optimizer",
    "Activation": "activations",
}


def _bytes(value: object) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def _kind(op_name: str) -> str | None:
    for marker, kind in _KINDS:
        if marker in op_name:
            return kind
    return None


class CollectiveCounter(TorchDispatchMode):
    """Count the bytes of every collective dispatched while active, per kind and per family.

    Keys are ``"<kind> (<family>)"``: kind is ``all_gather``, ``reduce_scatter``, ``all_reduce``,
    ``broadcast`` or ``all_to_all``; family is ``dp`` for the in-place ``c10d`` ops (DDP's bucket
    all-reduce, FSDP2's all-gather and reduce-scatter) and ``tp`` for the functional collectives
    DTensor issues (tensor parallelism). ``wait``/``barrier`` ops move nothing and are not counted.

    Attributes:
        bytes_by_kind: the byte counts.
        calls_by_kind: the number of calls per key.
    """

    def __init__(self) -> None:
        super().__init__()
        self.bytes_by_kind: dict[str, int] = {}
        self.calls_by_kind: dict[str, int] = {}

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Sequence[type],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        """Run ``func``; when it is a collective, add its largest buffer's bytes to its kind."""
        result = func(*args, **(kwargs or {}))
        if func.namespace in _COLLECTIVE_NAMESPACES:
            kind = _kind(func.__name__)
            if kind is not None:
                family = "dp" if func.namespace == "c10d" else "tp"
                key = f"{kind} ({family})"
                size = max([_bytes(a) for a in args] + [_bytes(result) if func.namespace != "c10d" else 0])
                self.bytes_by_kind[key] = self.bytes_by_kind.get(key, 0) + size
                self.calls_by_kind[key] = self.calls_by_kind.get(key, 0) + 1
        return result


def memory_tracker(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> MemTracker:
    """The torch tracker for ``model``: ``FSDPMemTracker`` when it is an FSDP2 module, else ``MemTracker``.

    The model and optimizer are registered so that tensors created before the tracker starts count.
    """
    # torch 2.13: torch/distributed/_tools/fsdp2_mem_tracker.py:122 (private; FSDP2 peak memory by category)
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    # torch 2.13: torch/distributed/_tools/mem_tracker.py:324 (private; peak memory by category)
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return FSDPMemTracker(model, optimizer)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    return tracker


def tracked_breakdown(
    tracker: MemTracker, extra: Callable[[MemoryBreakdown], MemoryBreakdown] | None = None
) -> MemoryBreakdown:
    """The tracker's peak snapshot as a :class:`MemoryBreakdown` (all devices summed; one here).

    Args:
        tracker: a ``MemTracker`` / ``FSDPMemTracker`` that has run.
        extra: applied to the result (e.g. to add memory known by formula).
    """
    totals = {"parameters": 0, "gradients": 0, "optimizer": 0, "activations": 0, "temporaries": 0}
    for snapshot in tracker.get_tracker_snapshot("peak").values():
        for key, value in snapshot.items():
            name = getattr(key, "value", key)
            if name == "Total":
                continue
            totals[_CATEGORY_OF.get(str(name), "temporaries")] += int(value)
    breakdown = MemoryBreakdown(**totals)
    return extra(breakdown) if extra is not None else breakdown
