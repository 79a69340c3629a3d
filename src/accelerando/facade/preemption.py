"""Checkpoint-and-exit on preemption (setting ``preemption_checkpoint``, implied by ``auto_resume``).

A signal handler for SIGTERM (and SIGUSR1, SLURM's early-warning signal, when the process was not
started by ``accelerando launch``: there SIGUSR1 asks for a stack dump, and the launcher turns its own
SIGUSR1 into SIGTERM for the processes) only sets a flag. The training notices the flag where a step
ends, when an ``accelerator.accumulate(...)`` block exits. Every process must stop at the same step:
each one shares its flag with the others through an asynchronous all-reduce (on a gloo group of its
own) started at one step end and read at the next, so the decision costs no wait and every process
reads the same answer at the same step.

The checkpoint itself waits for the next batch boundary: the loop asking a prepared dataloader for its
next batch (or entering ``accumulate`` again). By then the loop body after the block has run (the
script's ``completed_steps += 1``, its progress bar and logging, a counter registered with
``register_for_checkpointing``), the optimizer and scheduler have stepped, and no batch of the next
step has been read, so the checkpoint holds the script's bookkeeping of that step and resumes
bit-exactly. Then every process saves (``save_state()`` into the project folder) and exits with
:data:`PREEMPTED_EXIT_CODE`. A loop that never asks for another batch (the training ended) finishes
as it would have, without that checkpoint.

Until the first step has ended (no ``accumulate`` block yet) the signals keep their usual meaning,
so a script that never reaches a step boundary still stops at once.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    import torch
    from torch.distributed import ProcessGroup, Work

    from accelerando.core.gradient_state import GradientState
    from accelerando.plugins.project import ProjectConfiguration

    # What signal.signal() returns and takes: a handler, SIG_DFL / SIG_IGN, or None.
    _Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

__all__ = ["PREEMPTED_EXIT_CODE", "PreemptionWatch", "checkpoint_at_next_batch", "install"]

logger = logging.getLogger(__name__)

#: Exit status of a process that checkpointed on preemption: 128 + SIGTERM, what a scheduler
#: (SLURM, Kubernetes) expects from a job stopped by SIGTERM; a requeueable job is then started again.
PREEMPTED_EXIT_CODE = 143


def _under_launcher() -> bool:
    """Whether ``accelerando launch``'s process shim registered SIGUSR1 for stack dumps here."""
    child = sys.modules.get("accelerando.launchers._child")  # looked up, never imported from here
    return child is not None and getattr(child, "_stack_file", None) is not None


class PreemptionWatch:
    """The flag the signal handler sets, and the agreement on when to act on it."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self.boundaries = 0  # step ends seen so far
        self._previous: dict[int, _Handler] = {}
        self._pending: tuple[Work, torch.Tensor] | None = None  # the all-reduce in flight and its tensor
        self._group: ProcessGroup | None = None

    def install(self) -> list[str]:
        """Install the handlers (main thread only); return the names of the signals taken."""
        if threading.current_thread() is not threading.main_thread():
            logger.warning("preemption_checkpoint: not in the main thread, no signal handler installed")
            return []
        wanted = [signal.SIGTERM]
        if hasattr(signal, "SIGUSR1") and not _under_launcher():
            wanted.append(signal.SIGUSR1)
        for sig in wanted:
            self._previous[int(sig)] = signal.signal(sig, self._on_signal)
        return [sig.name for sig in wanted]

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.boundaries == 0:  # no step has ended yet: nowhere to checkpoint, act as before
            previous = self._previous.get(signum, signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
                return
            signal.signal(signum, previous)
            signal.raise_signal(signum)
            return
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def should_stop(self, num_processes: int) -> bool:
        """Called at each step end: whether every process agrees to stop now."""
        self.boundaries += 1
        if num_processes <= 1:
            return self.requested
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            return self.requested
        if self._group is None:
            group = dist.new_group(backend="gloo")  # every process reaches the first step end
            assert isinstance(group, dist.ProcessGroup)  # every process is a member
            self._group = group
        agreed = False
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            agreed = bool(flag.item())
        if agreed:
            self._pending = None
            return True
        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        assert work is not None  # async_op=True returns the work handle
        self._pending = (work, flag)
        return False


class PendingSave(Protocol):
    """An asynchronous save in progress (``AsyncSaveHandle``)."""

    def result(self) -> str:
        """Wait for the commit; return the checkpoint folder."""
        ...


class Checkpointing(Protocol):
    """What a preemption checkpoint uses of the Accelerator."""

    @property
    def gradient_state(self) -> GradientState:
        """Where the checkpoint waits for the next batch boundary (``at_next_batch``)."""
        ...

    @property
    def is_main_process(self) -> bool:
        """True on the process of global index 0."""
        ...

    def save_state(self) -> str | PendingSave:
        """Save the training state (a folder, or a pending asynchronous save)."""
        ...

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        ...


def checkpoint_and_exit(accelerator: Checkpointing, watch: PreemptionWatch) -> None:
    """Save the training state into the project folder on every process and exit with 143.

    Raises:
        SystemExit: always, with :data:`PREEMPTED_EXIT_CODE`.
    """
    path = accelerator.save_state()
    if not isinstance(path, str):  # an asynchronous save: it must be on disk before the exit
        path = path.result()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(
            f"accelerando: {watch.signal_name or 'a signal'} received; checkpoint {path} written, exiting "
            f"with status {PREEMPTED_EXIT_CODE} (requeue the job to resume).",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(PREEMPTED_EXIT_CODE)


def checkpoint_at_next_batch(accelerator: Checkpointing, watch: PreemptionWatch) -> None:
    """Arm the checkpoint-and-exit for the next batch boundary (every process agreed to stop).

    Called where a step ends (``accumulate`` exits); the checkpoint is taken when the loop next asks
    a prepared dataloader for a batch or enters ``accumulate``, see the module docstring.
    """
    accelerator.gradient_state.at_next_batch = functools.partial(checkpoint_and_exit, accelerator, watch)


def install(config: ProjectConfiguration) -> PreemptionWatch:
    """Arm preemption checkpoints for a run saving into the project ``config`` describes.

    Raises:
        ValueError: If the project has no automatically named checkpoints (there is nowhere to save).
    """
    if not config.automatic_checkpoint_naming or config.project_dir is None:
        raise ValueError(
            "preemption_checkpoint/auto_resume need a project folder with automatically named checkpoints: "
            "pass project_config=ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    watch = PreemptionWatch()
    watch.install()
    return watch
