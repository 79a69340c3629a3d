"""Run code in several real processes for tests (gloo on CPU, one rank per process).

``run_distributed`` starts ``world_size`` fresh interpreters (multiprocessing "spawn"), gives each the
environment torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
calls the function, and collects return values. The first failure is re-raised in the caller as
``DistributedTestError`` tagged with its rank and carrying the child's traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias, TypeVar, cast

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue

__all__ = ["DistributedTestError", "execute_subprocess", "get_free_port", "launch_script", "run_distributed"]


_R = TypeVar("_R")
# What a rank reports: (rank, True, its pickled result) or (rank, False, its traceback).
_Report: TypeAlias = "tuple[int, bool, bytes | str]"


class DistributedTestError(RuntimeError):
    """A process of a multi-process test failed; the message holds its rank and traceback."""


def get_free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(
    fn: Callable[..., object],
    rank: int,
    world_size: int,
    port: int,
    env: Mapping[str, str],
    args: tuple[object, ...],
    results: Queue[_Report],
    stack_file: str,
) -> None:
    _dump_stack_on_request(stack_file)
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
    )
    os.environ.update(env)
    try:
        value = fn(*args)
        # Plain pickle copies tensor data; the queue's own pickler would pass shared-memory file
        # descriptors that die with this process before the parent reads them.
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        results.put((rank, False, traceback.format_exc()))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass


_STACK_SIGNAL = getattr(signal, "SIGUSR1", None)


def _dump_stack_on_request(stack_file: str) -> None:
    """Make this process write every thread's Python stack to ``stack_file`` when the parent asks."""
    if _STACK_SIGNAL is None:
        return
    import faulthandler

    # Kept open for the life of the process: faulthandler writes to the descriptor from a signal handler.
    handle = open(stack_file, "w")  # noqa: SIM115
    faulthandler.register(_STACK_SIGNAL, file=handle, all_threads=True)


def _stacks_of_hung_ranks(procs: Sequence[BaseProcess], stack_files: Sequence[str], done: set[int]) -> str:
    """Ask every rank still running for its Python stacks; return them, innermost frames first."""
    if _STACK_SIGNAL is None:
        return ""
    waiting = [rank for rank, proc in enumerate(procs) if rank not in done and proc.is_alive()]
    for rank in waiting:
        pid = procs[rank].pid
        assert pid is not None  # a running process has one
        try:
            os.kill(pid, _STACK_SIGNAL)
        except OSError:
            pass
    time.sleep(1.0)
    parts = []
    for rank in waiting:
        try:
            with open(stack_files[rank]) as handle:
                lines = handle.read().splitlines()
        except OSError:
            lines = []
        # faulthandler lists the current thread first and each stack innermost frame first; the first
        # frames say what the rank was waiting in.
        shown = "\n".join(lines[:14]) if lines else "(no stack: the process did not answer)"
        parts.append(f"--- rank {rank} was waiting in:\n{shown}")
    return "\n".join(parts)


def run_distributed(
    fn: Callable[..., _R],
    world_size: int = 2,
    *args: object,
    env: Mapping[str, str] | None = None,
    timeout: float = 240.0,
) -> list[_R]:
    """Run ``fn(*args)`` in ``world_size`` fresh processes and return the per-rank results.

    Args:
        fn: a picklable (module-level) function; it runs once per rank.
        world_size: number of processes.
        *args: picklable positional arguments passed to every rank.
        env: extra environment variables for every rank.
        timeout: seconds to wait for all ranks.

    Returns:
        ``[result_of_rank_0, result_of_rank_1, ...]`` (results must be picklable).

    Raises:
        DistributedTestError: a rank raised (message names the rank and holds its traceback), died
            without reporting, or the run timed out.
    """
    ctx = mp.get_context("spawn")
    results: Queue[_Report] = ctx.Queue()
    port = get_free_port()
    stack_dir = tempfile.TemporaryDirectory(prefix="run_distributed_stacks_")
    stack_files = [os.path.join(stack_dir.name, f"rank{rank}.txt") for rank in range(world_size)]
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(fn, rank, world_size, port, dict(env or {}), args, results, stack_files[rank]),
        )
        for rank in range(world_size)
    ]
    # Each rank returns fn's result, pickled: the caller's _R.
    return cast("list[_R]", _run_ranks(procs, results, stack_dir, stack_files, timeout))


def execute_subprocess(
    cmd: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 300.0, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command, returning its completed process; fail with its whole output if it fails.

    Raises:
        DistributedTestError: the command exited non-zero or timed out.
    """
    full_env = {**os.environ, **(env or {})}
    try:
        proc = subprocess.run(
            list(cmd), env=full_env, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise DistributedTestError(
            f"{' '.join(cmd)} timed out after {timeout}s\n{exc.stdout}\n{exc.stderr}"
        ) from exc
    if proc.returncode != 0:
        raise DistributedTestError(
            f"{' '.join(cmd)} exited with {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return proc


def launch_script(
    path: str,
    num_processes: int = 2,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``path`` under ``python -m torch.distributed.run`` with ``num_processes`` CPU processes.

    Raises:
        DistributedTestError: any process failed (the message holds every child's output).
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={num_processes}",
        f"--master_port={get_free_port()}",
        path,
        *args,
    ]
    return execute_subprocess(cmd, env={"OMP_NUM_THREADS": "1", **(env or {})}, timeout=timeout)


def _run_ranks(
    procs: Sequence[BaseProcess],
    results: Queue[_Report],
    stack_dir: tempfile.TemporaryDirectory[str],
    stack_files: Sequence[str],
    timeout: float,
) -> list[object]:
    """Start ``procs`` (one per rank, in rank order), gather what each reports on ``results``, then reap them.

    Shared by :func:`run_distributed` and launchers of the same ranks by other start methods (the test
    suite's fork server). ``stack_dir`` is removed at the end.

    Returns:
        ``[result_of_rank_0, ...]``.

    Raises:
        DistributedTestError: a rank raised, died without reporting, or the run timed out (the hung
            ranks' stacks are in the message).
    """
    world_size = len(procs)
    for proc in procs:
        proc.start()
    outcome: dict[int, object] = {}
    failures: dict[int, str] = {}
    try:
        while len(outcome) + len(failures) < world_size:
            try:
                # Once one rank failed, the others usually fail soon after (a broken collective);
                # wait a little for them so the report shows the root cause, not only the echo.
                rank, ok, value = results.get(timeout=10 if failures else timeout)
            except queue.Empty as exc:
                if failures:
                    break
                waiting = sorted(set(range(world_size)) - set(outcome))
                raise DistributedTestError(
                    f"timed out after {timeout}s; ranks done: {sorted(outcome)}, still running: {waiting}\n"
                    + _stacks_of_hung_ranks(procs, stack_files, set(outcome))
                ) from exc
            if ok:
                assert isinstance(value, bytes)  # a result travels pickled
                outcome[rank] = pickle.loads(value)
            else:
                assert isinstance(value, str)  # a failure travels as its traceback's text
                failures[rank] = value
        if failures:
            report = "\n".join(f"--- rank {r} failed:\n{tb}" for r, tb in sorted(failures.items()))
            raise DistributedTestError(f"{len(failures)} of {world_size} ranks failed\n{report}")
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        stack_dir.cleanup()
    return [outcome[rank] for rank in range(world_size)]
