"""Cross-process steps of saving and loading: gathering every process's verdict, and finding out
whether the nodes share the checkpoint folder (which decides who commits with ``save_on_each_node``).
"""

from __future__ import annotations

import os
import uuid
import warnings
from typing import TYPE_CHECKING, Protocol, TypeVar

from accelerando.checkpointing.target import CheckpointTarget, MemorySlot

if TYPE_CHECKING:
    from accelerando.state import AcceleratorState, PartialState

__all__ = ["Exchange", "gather", "is_committer", "save_on_each_node"]

_T = TypeVar("_T")


class Exchange(Protocol):
    """An all-gather of one picklable object per process, such as :func:`gather`."""

    def __call__(self, obj: _T, num_processes: int, /) -> list[_T]:
        """Every process's ``obj``, in rank order, on every process."""
        ...


def gather(obj: _T, num_processes: int) -> list[_T]:
    """Every process's ``obj``, on every process (also a barrier)."""
    import torch.distributed as dist

    if num_processes > 1 and dist.is_available() and dist.is_initialized():
        out = [obj] * dist.get_world_size()  # every entry is replaced by that rank's object
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def is_committer(state: PartialState | AcceleratorState, save_on_each_node: bool) -> bool:
    """Whether this process stages and commits checkpoints (the main process, or with
    ``save_on_each_node`` each node's local main).
    """
    return bool(state.is_local_main_process if save_on_each_node else state.is_main_process)


# Per Accelerator: folder -> whether the nodes share it (file systems do not change during a run).
_SHARED_VERDICTS: MemorySlot[dict[str, bool]] = MemorySlot("shared-folder verdicts", dict)


def _nodes_share(target: CheckpointTarget, parent: str) -> bool:
    """Whether the nodes' local main processes all see ``parent`` as one folder (a shared file system).

    Each node's local main leaves a marker named with a token common to this call; if one sees another
    node's marker, the folder is shared. Collective (every process must call it); the verdict is
    remembered per target and folder, since file systems do not change during a run.
    """
    state = target.state
    if state.num_nodes <= 1:
        return False
    known = target.memory.get(_SHARED_VERDICTS)
    if parent in known:
        return known[parent]
    token = gather(uuid.uuid4().hex if state.is_main_process else None, state.num_processes)[0]
    node = getattr(state.cluster, "node_rank", state.process_index)
    marker = os.path.join(parent, f".accelerando-node-probe-{token}-{node}")
    created = False
    if state.is_local_main_process:
        try:  # a failure must not leave the other processes waiting in the gather below
            os.makedirs(parent, exist_ok=True)
            with open(marker, "w"):
                created = True
        except OSError:
            pass  # the save itself will then fail on this node, and every process learns why
    gather(None, state.num_processes)  # every marker is in place
    seen = False
    if state.is_local_main_process:
        prefix = f".accelerando-node-probe-{token}-"
        try:
            seen = any(n.startswith(prefix) and n != os.path.basename(marker) for n in os.listdir(parent))
        except OSError:
            seen = False
    shared = any(gather(seen, state.num_processes))  # also: every process has looked
    if created:
        os.remove(marker)
    known[parent] = shared
    return shared


def save_on_each_node(target: CheckpointTarget, final_dir: str) -> bool:
    """Effective ``save_on_each_node`` for this save; collective when the setting is on.

    It is off (with one warning) when the nodes share the folder, where several nodes committing the
    same checkpoint would race.
    """
    if not target.project_configuration.save_on_each_node:
        return False
    parent = os.path.dirname(os.path.abspath(final_dir))
    if not _nodes_share(target, parent):
        return True
    if target.state.is_main_process and not target.warned_shared_fs:
        warnings.warn(
            f"save_on_each_node=True, but every node sees {parent!r} (a shared file system): the checkpoint "
            "is written and committed once, by the main process. Use save_on_each_node only for "
            "node-local disks.",
            stacklevel=4,
        )
        target.warned_shared_fs = True
    return False
