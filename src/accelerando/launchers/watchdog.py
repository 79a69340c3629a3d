"""The launcher's view of its processes: a run folder, a hang watchdog, failure records.

Each process of a multi-process launch starts through :mod:`accelerando.launchers._child`, which
writes into a run folder the launcher made: ``rank<N>.pid`` (pid and main-thread id),
``rank<N>.stack`` (its threads' stacks, dumped on SIGUSR1) and ``rank<N>.failure.json`` (an uncaught
exception with a nanosecond time stamp). :class:`RunFolder` reads them.

:class:`Watchdog` is a thread of the launcher. What it measures is progress of the job, read from
each process's **main thread** (the thread that runs the user's script; Linux gives it the process's
id as thread id, so ``/proc/<pid>/task/<pid>/stat`` holds its CPU time). A main thread waiting in a
collective (gloo, a barrier, a rendezvous) sits in one call until every peer has joined and uses no
CPU there, so "the main thread of process R used no CPU for ``timeout_s`` seconds and its stack is in
``torch.distributed``" means that collective has not completed for ``timeout_s`` seconds, whatever
the other processes do meanwhile. The whole process's CPU time is not the measure: background
threads run while the main thread waits (gloo's ``gloo_tcp_loop`` thread alone uses about 2.5 ms of
CPU a second in every process of a gloo job), so a hung process would look busy. The rule:

- a process is *quiet* when its main thread used less than ``threshold_s`` CPU seconds (1 ms a
  second of the timeout, at least 50 ms) for ``timeout_s`` seconds; any process starting or ending
  restarts every clock (that is progress of the job);
- a quiet process whose main thread is in a collective (its stack, asked once) while others run
  elsewhere (a rank spinning in a loop of its own, or stuck in a long computation) means those others
  did not arrive: the job is stopped;
- when every live process is quiet, the job is stopped when one of them waits in a collective, or when
  none does and no process as a whole did work either (every one waits, sleeps, or waits for peers
  that finished: the job cannot end by itself). A quiet main thread in a process that does work in
  other threads (at least 1% of a core: ten times gloo's background use) outside any collective is
  left alone (training run in a thread the main thread joins).

A process whose main thread computes, however long, is never quiet: a long legitimate step on every
rank is not stopped; one process computing alone for longer than the timeout while the others wait
for it in a collective is (it looks exactly like one spinning in a loop that never ends: raise the
timeout for such jobs). Why no progress counter in the training loop: the stack of a quiet main
thread already says whether it is in a collective, for every collective (the user's own
``torch.distributed`` calls included) at no cost per step; a counter would need a hook in each.

The watchdog then asks each live process for its stacks (SIGUSR1: faulthandler writes them from the
signal handler, so a process spinning in pure Python answers too), names those not waiting in a
collective as the ones that did not arrive (with where they were), and kills every live process; the
agent then ends the job. Nothing runs in the processes for this (no per-step counter, no collective):
the watchdog reads ``/proc`` and, only for a process quiet for ``timeout_s``, asks for its stacks once
(microseconds of the process's time). :class:`ProgressMonitor` holds the decision, apart from the
processes it watches. A GPU collective that hangs spins a CPU thread: that case is left to the process
group's own timeout (NCCL's watchdog), which ends the process with an error the summary names.
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
from typing import TypedDict

from accelerando.launchers._child import SHIM_FILES

__all__ = [
    "HangReport",
    "ProgressMonitor",
    "RunFolder",
    "Verdict",
    "Watchdog",
    "cpu_readings",
    "is_waiting",
    "main_thread_stack",
]

# Frames of a main thread that is waiting for its peers rather than stuck on its own.
_WAITING_MARKERS = (
    "torch/distributed/",
    "torch/nn/parallel/distributed.py",
    "torch/autograd/",
    "accelerando/core/process_group.py",
)
_THREAD_HEADER = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_STACK_WAIT_S = 2.0  # how long a process is given to write its stacks after SIGUSR1
_STACK_SETTLE_S = 0.1  # then how long its dump is given to be written whole


class _FailureRecordBase(TypedDict):
    time_ns: int  # time.time_ns() when the exception reached the top of the process


class FailureRecord(_FailureRecordBase, total=False):
    """What a process wrote about its uncaught exception (see :mod:`accelerando.launchers._child`)."""

    type: str
    message: str
    where: str


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

    def failures(self) -> dict[int, FailureRecord]:
        """``rank -> record`` of the uncaught exceptions (``time_ns``, ``type``, ``message``, ``where``)."""
        found: dict[int, FailureRecord] = {}
        for record_file in self.path.glob("rank*.failure.json"):
            try:
                record = json.loads(record_file.read_text(encoding="utf-8"))
                rank = int(record_file.name[4:].split(".")[0])
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and isinstance(record.get("time_ns"), int):
                found[rank] = FailureRecord(**record)  # the JSON object, as the record type
        return found

    def stack(self, rank: int, offset: int = 0) -> str:
        """What ``rank`` wrote on SIGUSR1 from byte ``offset`` on ("" when nothing): each dump is appended."""
        try:
            with open(self.path / f"rank{rank}.stack", "rb") as handle:
                handle.seek(offset)
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def stack_size(self, rank: int) -> int:
        """Bytes ``rank`` has written on SIGUSR1 so far (where its next dump starts)."""
        try:
            return (self.path / f"rank{rank}.stack").stat().st_size
        except OSError:
            return 0


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


def is_waiting(frames: list[str]) -> bool:
    """Whether main-thread ``frames`` are waiting for peers (in torch.distributed, DDP, autograd's wait)."""
    return any(marker in frame for frame in frames for marker in _WAITING_MARKERS)


def _caller(frames: list[str]) -> str:
    """The innermost frame outside torch: the user's call that is waiting."""
    return next((f for f in frames if "/torch/" not in f), frames[0] if frames else "?")


def _stat_cpu(path: str) -> float | None:
    """CPU seconds (user + system) in a ``/proc`` stat file; None when gone or a zombie."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()
    if rest[0] in ("Z", "X"):
        return None
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def cpu_readings(pid: int) -> tuple[float, float] | None:
    """CPU seconds used so far by the main thread of ``pid`` and by all its threads together.

    The main thread is the one whose id is the process id (Linux): the thread that runs the script.

    Returns:
        ``(main thread, whole process)``; None when the process is gone (or a zombie). When the
        main thread cannot be read on its own, the whole process stands for it.
    """
    process = _stat_cpu(f"/proc/{pid}/stat")
    if process is None:
        return None
    main = _stat_cpu(f"/proc/{pid}/task/{pid}/stat")
    return (process if main is None else main), process


@dataclass
class HangReport:
    """What the watchdog found when it stopped a job.

    Attributes:
        timeout_s: seconds without progress that triggered it.
        stuck: ``rank -> main-thread frames`` of the processes that did not arrive.
        waiting: ``rank -> main-thread frames`` of those waiting for them in a collective.
        finished: ranks that had already exited.
        waited: ranks found waiting in a collective for ``timeout_s`` while the stuck ones kept
            running; empty when no process made progress at all.
    """

    timeout_s: float
    stuck: dict[int, list[str]] = field(default_factory=dict)
    waiting: dict[int, list[str]] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)
    waited: list[int] = field(default_factory=list)

    def describe(self) -> str:
        """The message the launcher prints: who did not arrive, where each was, and the fix."""
        names = ", ".join(str(r) for r in sorted(self.stuck))
        if self.waited:
            waiters = ", ".join(str(r) for r in sorted(self.waited))
            head = (
                f"accelerando launch: process(es) {waiters} waited in a collective for {self.timeout_s:g} s "
                f"(hang_timeout): process(es) {names} did not arrive."
            )
        else:
            head = (
                f"accelerando launch: no process made progress for {self.timeout_s:g} s (hang_timeout): "
                f"process(es) {names} did not arrive."
            )
        lines = [head]
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
            "call on some ranks, a loop that never ends, a deadlock, input that never came); if the work "
            "is just slow (one process working alone while the others wait, e.g. preprocessing under "
            "main_process_first), raise --hang_timeout (0 disables the watchdog)."
        )
        return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    """What :meth:`ProgressMonitor.observe` concluded.

    Attributes:
        kind: ``"idle"``: no live process's main thread used CPU for the timeout; ``"suspect"``:
            these processes' main threads used none for the timeout while others ran, so the
            watchdog looks at their stacks (waiting in a collective: a hang).
        ranks: the processes quiet for the timeout.
        working: among ``ranks``, those whose process as a whole did work meanwhile (in threads
            other than the main one): an idle job with one of them and no collective waiting is
            left alone.
    """

    kind: str
    ranks: frozenset[int]
    working: frozenset[int] = frozenset()


class ProgressMonitor:
    """Per-process quiet clocks, fed with CPU readings; says when the watchdog must look at stacks.

    A process's clock restarts when its main thread has used ``threshold_s`` CPU seconds since the
    clock's last start, and every clock restarts when a process starts or ends (that is progress of
    the job). Background threads do not count (see the module docstring).

    Args:
        timeout_s: seconds a process may stay quiet before it is suspect.
        threshold_s: main-thread CPU seconds below which a process counts as quiet (noise).
        working_share: share of a core the whole process must have used over a quiet clock's time
            to count as working in other threads (default 1%: gloo's background thread uses 0.25%).
    """

    def __init__(self, timeout_s: float, threshold_s: float, working_share: float = 0.01):
        self.timeout_s = timeout_s
        self.threshold_s = threshold_s
        self.working_share = working_share
        # rank -> (main-thread CPU at its start, process CPU at its start, its start)
        self._clocks: dict[int, tuple[float, float, float]] = {}
        self._process: dict[int, float] = {}  # rank -> the last whole-process reading

    def observe(
        self, now: float, cpu: dict[int, float], process_cpu: dict[int, float] | None = None
    ) -> Verdict | None:
        """Take one reading of every live process at ``now`` (monotonic seconds).

        Args:
            now: the time of the reading.
            cpu: ``rank -> CPU seconds`` used so far by each live process's main thread.
            process_cpu: ``rank -> CPU seconds`` used so far by each whole process (all threads);
                None: the main thread's reading stands for it.

        Returns:
            ``None`` while nothing is due, else the :class:`Verdict`.
        """
        self._process = dict(cpu if process_cpu is None else process_cpu)
        if set(cpu) != set(self._clocks):
            self._clocks = {rank: (used, self._process[rank], now) for rank, used in cpu.items()}
            return None
        for rank, used in cpu.items():
            if used - self._clocks[rank][0] >= self.threshold_s:
                self._clocks[rank] = (used, self._process[rank], now)
        quiet = frozenset(r for r, clock in self._clocks.items() if now - clock[2] >= self.timeout_s)
        if not quiet:
            return None
        if quiet != set(cpu):
            return Verdict("suspect", quiet)
        working = frozenset(
            rank
            for rank in quiet
            if self._process[rank] - self._clocks[rank][1]
            >= self.working_share * (now - self._clocks[rank][2])
        )
        return Verdict("idle", quiet, working)

    def excuse(self, ranks: frozenset[int] | set[int], now: float) -> None:
        """Restart the clocks of ``ranks`` (their stacks showed them quiet on their own, not waiting)."""
        for rank in ranks:
            if rank in self._clocks:
                self._clocks[rank] = (self._clocks[rank][0], self._process[rank], now)


class Watchdog(threading.Thread):
    """Stop a launch whose processes stopped making progress (see the module docstring).

    Args:
        folder: the launch's run folder.
        timeout_s: seconds a collective may wait for its peers (or the whole job may sit idle)
            before the job is stopped.
        poll_s: seconds between looks at the processes; defaults to a tenth of the timeout (0.2-5 s).
    """

    def __init__(self, folder: RunFolder, timeout_s: float, poll_s: float | None = None):
        super().__init__(name="accelerando-watchdog", daemon=True)
        self.folder = folder
        self.timeout_s = timeout_s
        self.poll_s = poll_s if poll_s is not None else min(5.0, max(0.2, timeout_s / 10))
        self.report: HangReport | None = None
        self._stop_event = threading.Event()
        # main-thread CPU below this (1 ms a second of the timeout, at least 50 ms) is a quiet thread's noise
        self.monitor = ProgressMonitor(timeout_s, max(0.05, 0.001 * timeout_s))

    def stop(self) -> None:
        """End the thread (the launch is over)."""
        self._stop_event.set()

    def run(self) -> None:  # noqa: D102 - threading.Thread's contract
        while not self._stop_event.wait(self.poll_s):
            processes = self.folder.processes()
            readings = {rank: cpu_readings(pid) for rank, (pid, _) in processes.items()}
            live = {rank: seen for rank, seen in readings.items() if seen is not None}
            now = time.monotonic()
            main = {rank: seen[0] for rank, seen in live.items()}
            verdict = self.monitor.observe(now, main, {rank: seen[1] for rank, seen in live.items()})
            if verdict is None:
                continue
            if verdict.kind == "idle":
                stacks = self._stacks(processes, set(live))
                if verdict.working and not any(is_waiting(frames) for frames in stacks.values()):
                    self.monitor.excuse(verdict.ranks, time.monotonic())  # work in a thread of its own
                    continue
                self.report = self._stop_job(processes, set(live), stacks)
                return
            # Only the quiet ones are asked first: a busy process is not interrupted unless it is stuck.
            stacks = self._stacks(processes, set(verdict.ranks))
            waited = sorted(rank for rank in verdict.ranks if is_waiting(stacks[rank]))
            if not waited:
                self.monitor.excuse(verdict.ranks, time.monotonic())
                continue
            stacks.update(self._stacks(processes, set(live) - set(verdict.ranks)))
            self.report = self._stop_job(processes, set(live), stacks, waited)
            return

    def _stacks(self, processes: dict[int, tuple[int, int]], ranks: set[int]) -> dict[int, list[str]]:
        """Ask ``ranks`` for their stacks (SIGUSR1) and return each one's main-thread frames."""
        asked = {rank: self.folder.stack_size(rank) for rank in ranks if processes[rank][1]}
        for rank in asked:
            _signal(processes[rank][0], signal.SIGUSR1)
        deadline = time.monotonic() + _STACK_WAIT_S
        while time.monotonic() < deadline and not all(
            self.folder.stack_size(r) > at for r, at in asked.items()
        ):
            time.sleep(0.05)
        time.sleep(_STACK_SETTLE_S)  # a dump is written in pieces: let the last one end
        return {
            rank: main_thread_stack(self.folder.stack(rank, asked.get(rank, 0)), processes[rank][1])
            if rank in asked
            else []
            for rank in ranks
        }

    def _stop_job(
        self,
        processes: dict[int, tuple[int, int]],
        live: set[int],
        stacks: dict[int, list[str]],
        waited: list[int] | None = None,
    ) -> HangReport:
        report = HangReport(self.timeout_s, finished=sorted(set(processes) - live), waited=waited or [])
        for rank in sorted(live):
            frames = stacks.get(rank, [])
            (report.waiting if is_waiting(frames) else report.stuck)[rank] = frames
        if not report.stuck:  # all wait for one another (mismatched collectives): name them all
            report.stuck, report.waiting, report.waited = report.waiting, {}, []
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
