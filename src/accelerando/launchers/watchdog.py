"""The launcher's view of its processes: a run folder, a hang watchdog, failure records.

Each process of a multi-process launch starts through :mod:`accelerando.launchers._child`, which
writes into a run folder the launcher made: ``rank<N>.pid`` (pid and main-thread id),
``rank<N>.stack`` (its threads' stacks, dumped on SIGUSR1) and ``rank<N>.failure.json`` (an uncaught
exception with a nanosecond time stamp). :class:`RunFolder` reads them.

:class:`Watchdog` is a thread of the launcher. A process "makes progress" while it uses CPU time
(``/proc/<pid>/stat``): a process waiting in a gloo collective, a barrier, or a ``sleep`` uses none.
When no live process has made progress for ``timeout_s`` seconds (every process is waiting, or the
only ones left wait for peers that finished), the job cannot end by itself: the watchdog asks each
live process for its stacks, names those not waiting in a collective as the ones that did not
arrive (with where they were), and kills every live process; the agent then ends the job. A GPU
collective that hangs spins a CPU thread: that case is left to the process group's own timeout
(NCCL's watchdog), which ends the process with an error the summary names.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerando.launchers._child import SHIM_FILES

__all__ = ["HangReport", "RunFolder", "Watchdog", "main_thread_stack"]

# Frames of a main thread that is waiting for its peers rather than stuck on its own.
_WAITING_MARKERS = (
    "torch/distributed/",
    "torch/nn/parallel/distributed.py",
    "torch/autograd/",
    "accelerando/process_group.py",
)
_THREAD_HEADER = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_STACK_WAIT_S = 2.0  # how long a process is given to write its stacks after SIGUSR1


class RunFolder:
    """The files the processes of one launch write for the launcher (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def processes(self) -> dict[int, tuple[int, int]]:
        """``rank -> (pid, main-thread id)`` of every process that has started (thread id 0: none)."""
        found: dict[int, tuple[int, int]] = {}
        for pid_file in self.path.glob("rank*.pid"):
            try:
                fields = pid_file.read_text(encoding="ascii").split()
                found[int(pid_file.stem[4:])] = (int(fields[0]), int(fields[1]) if len(fields) > 1 else 0)
            except (OSError, ValueError, IndexError):
                continue  # being written: seen at the next poll
        return found

    def failures(self) -> dict[int, dict[str, Any]]:
        """``rank -> record`` of the uncaught exceptions (``time_ns``, ``type``, ``message``, ``where``)."""
        found: dict[int, dict[str, Any]] = {}
        for record_file in self.path.glob("rank*.failure.json"):
            try:
                record = json.loads(record_file.read_text(encoding="utf-8"))
                rank = int(record_file.name[4:].split(".")[0])
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and isinstance(record.get("time_ns"), int):
                found[rank] = record
        return found

    def stack(self, rank: int) -> str:
        """What ``rank`` wrote on SIGUSR1 ("" when nothing)."""
        try:
            return (self.path / f"rank{rank}.stack").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""


def main_thread_stack(dump: str, main_ident: int) -> list[str]:
    """The frame lines (innermost first) of the main thread in a faulthandler dump ([] if absent)."""
    lines: list[str] = []
    inside = False
    for line in dump.splitlines():
        header = _THREAD_HEADER.match(line)
        if header:
            if inside:
                break
            inside = int(header.group(1), 16) == main_ident
        elif inside and line.strip():
            lines.append(line.strip())
    return [line for line in lines if not _is_shim_frame(line)]


def _is_shim_frame(line: str) -> bool:
    """Whether a faulthandler frame line is the launch shim's or runpy's (they start every stack)."""
    name = line.split('"')[1] if line.count('"') >= 2 else ""
    return name in SHIM_FILES


def _caller(frames: list[str]) -> str:
    """The innermost frame outside torch: the user's call that is waiting."""
    return next((f for f in frames if "/torch/" not in f), frames[0] if frames else "?")


def _cpu_and_state(pid: int) -> tuple[float, str] | None:
    """CPU seconds used by all threads of ``pid`` and its state letter; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()
    state = rest[0]
    if state in ("Z", "X"):
        return None
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK"), state


@dataclass
class HangReport:
    """What the watchdog found when it stopped a job.

    Attributes:
        timeout_s: seconds without progress that triggered it.
        stuck: ``rank -> main-thread frames`` of the processes that did not arrive.
        waiting: ``rank -> main-thread frames`` of those waiting for them in a collective.
        finished: ranks that had already exited.
    """

    timeout_s: float
    stuck: dict[int, list[str]] = field(default_factory=dict)
    waiting: dict[int, list[str]] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)

    def describe(self) -> str:
        """The message the launcher prints: who did not arrive, where each was, and the fix."""
        names = ", ".join(str(r) for r in sorted(self.stuck))
        lines = [
            f"accelerando launch: no process made progress for {self.timeout_s:g} s (hang_timeout): "
            f"process(es) {names} did not arrive."
        ]
        for rank, frames in sorted(self.stuck.items()):
            where = frames[0] if frames else "(no stack: the process did not answer SIGUSR1)"
            lines.append(f"  process {rank} was at {where}")
            lines += [f"      {frame}" for frame in frames[1:12]]
        for rank, frames in sorted(self.waiting.items()):
            lines.append(f"  process {rank} was waiting for them in a collective, at {_caller(frames)}")
        if self.finished:
            lines.append(f"  process(es) {', '.join(map(str, sorted(self.finished)))} had already exited.")
        lines.append(
            "Every process was stopped. Fix: find why the process(es) above stopped (a missing collective "
            "call on some ranks, a deadlock, input that never came); if the work is just slow without "
            "using CPU, raise --hang_timeout (0 disables the watchdog)."
        )
        return "\n".join(lines)


class Watchdog(threading.Thread):
    """Stop a launch whose processes all stopped making progress (see the module docstring).

    Args:
        folder: the launch's run folder.
        timeout_s: seconds without CPU progress before the job is stopped.
        poll_s: seconds between looks at the processes; defaults to a tenth of the timeout (0.2-5 s).
    """

    def __init__(self, folder: RunFolder, timeout_s: float, poll_s: float | None = None):
        super().__init__(name="accelerando-watchdog", daemon=True)
        self.folder = folder
        self.timeout_s = timeout_s
        self.poll_s = poll_s if poll_s is not None else min(5.0, max(0.2, timeout_s / 10))
        self.report: HangReport | None = None
        self._stop_event = threading.Event()
        self._threshold_s = max(0.05, 0.001 * timeout_s)  # CPU below this is an idle process's noise

    def stop(self) -> None:
        """End the thread (the launch is over)."""
        self._stop_event.set()

    def run(self) -> None:  # noqa: D102 - threading.Thread's contract
        reference: dict[int, float] = {}
        since = time.monotonic()
        while not self._stop_event.wait(self.poll_s):
            live = {}
            for rank, (pid, _) in self.folder.processes().items():
                seen = _cpu_and_state(pid)
                if seen is not None:
                    live[rank] = seen[0]
            moved = set(live) != set(reference) or any(
                cpu - reference[rank] >= self._threshold_s for rank, cpu in live.items()
            )
            if moved or not live:
                reference, since = live, time.monotonic()
            elif time.monotonic() - since >= self.timeout_s:
                self.report = self._stop_job(set(live))
                return

    def _stop_job(self, live: set[int]) -> HangReport:
        processes = self.folder.processes()
        asked = [rank for rank in live if processes[rank][1]]
        for rank in asked:
            _signal(processes[rank][0], signal.SIGUSR1)
        deadline = time.monotonic() + _STACK_WAIT_S
        while time.monotonic() < deadline and not all(self.folder.stack(r) for r in asked):
            time.sleep(0.05)
        report = HangReport(self.timeout_s, finished=sorted(set(processes) - live))
        for rank in sorted(live):
            frames = main_thread_stack(self.folder.stack(rank), processes[rank][1])
            waiting = any(marker in frame for frame in frames for marker in _WAITING_MARKERS)
            (report.waiting if waiting else report.stuck)[rank] = frames
        if not report.stuck:  # all wait for one another (mismatched collectives): name them all
            report.stuck, report.waiting = report.waiting, {}
        for rank in live:
            _signal(processes[rank][0], signal.SIGKILL, group=True)
        return report


def _signal(pid: int, sig: int, group: bool = False) -> None:
    try:
        # Each process leads its own process group (the agent starts it in a new session): killing
        # the group also ends what it started (data-loader workers).
        if group and os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except OSError:
        pass  # already gone
