"""Rank variables for processes forked by ``torch.multiprocessing``: :class:`PrepareForLaunch`."""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable

from accelerando.common.constants import TORCH_DISTRIBUTED_OPERATION_TYPES
from accelerando.core.settings import environment_setting

__all__ = ["PrepareForLaunch"]

# the launch helpers' logger: messages keep the name they had before the split
logger = logging.getLogger("accelerando.launchers.reference")

# Distributed types whose forked processes need LOCAL_RANK / RANK (every multi-process type but XLA).
_RANKED_TYPES = frozenset(TORCH_DISTRIBUTED_OPERATION_TYPES)


class PrepareForLaunch:
    """Wrap a function so that each process forked by ``torch.multiprocessing`` knows its rank.

    ``torch.multiprocessing.start_processes(PrepareForLaunch(fn, "MULTI_GPU"), args, nprocs=n)`` calls
    the object with the process index first: it sets ``LOCAL_RANK`` (the index), ``RANK``
    (``NPROC * NODE_RANK + index``, from those variables) and ``FORK_LAUNCHED=1`` in that process's
    environment, then calls ``fn(*args)``.

    Args:
        launcher: the function each process runs.
        distributed_type: the job's distributed type (a ``DistributedType`` or its name); ranks are
            set for every multi-process type except XLA (which numbers its processes itself).
        debug: on an exception, log it with the process's rank and the traceback, and record it in
            the file named by ``ACCELERATE_DEBUG_RDV_FILE`` when set, before re-raising.
    """

    def __init__(
        self, launcher: Callable[..., object], distributed_type: object = "NO", debug: bool = False
    ) -> None:
        self.launcher = launcher
        self.distributed_type = str(getattr(distributed_type, "value", distributed_type))
        self.debug = debug

    def __call__(self, index: int, *args: object) -> object:
        """Set this process's rank variables and run the function.

        Args:
            index: the process's index among those forked on this machine.
            *args: the function's arguments.

        Returns:
            What the function returns.
        """
        if self.distributed_type in _RANKED_TYPES:
            nproc = int(os.environ.get("NPROC", 1))
            node_rank = int(os.environ.get("NODE_RANK", 0))
            os.environ["LOCAL_RANK"] = str(index)
            os.environ["RANK"] = str(nproc * node_rank + index)
        os.environ["FORK_LAUNCHED"] = "1"
        if not self.debug:
            return self.launcher(*args)
        try:
            return self.launcher(*args)
        except Exception:
            rank = os.environ.get("RANK", str(index))
            details = traceback.format_exc()
            logger.error("Process %s (index %d) failed:\n%s", rank, index, details)
            record = environment_setting("debug_rdv_file")
            if record:
                with open(record, "a", encoding="utf-8") as handle:
                    handle.write(f"rank {rank}:\n{details}\n")
            raise

    def __repr__(self) -> str:
        return f"PrepareForLaunch({self.launcher!r}, distributed_type={self.distributed_type!r}, debug={self.debug})"
