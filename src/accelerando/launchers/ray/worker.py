"""One process of an ``accelerando launch --ray`` job: a Ray actor that runs the script as a child process.

The driver (:mod:`accelerando.launchers.ray.driver`) makes one :class:`RankProcess` actor per process
and calls, in this order: :meth:`RankProcess.where` (to rank the actors by machine),
:meth:`RankProcess.free_port` (rank 0 only: the rendezvous port), :meth:`RankProcess.start` with the
process's environment, then :meth:`RankProcess.poll` until it returns an exit status, and
:meth:`RankProcess.stop` when another process failed. The script runs as ``accelerando launch`` runs
it: ``python -u -m accelerando.launchers._child`` (the kernel ends it when the actor dies; with
``--install_as_accelerate`` it installs accelerando as ``accelerate`` first), with the variables of a
torchrun process, so that inside it nothing tells a Ray launch from a local one.

Only the standard library is imported here; Ray wraps the class (``ray.remote``) in the driver.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import IO

__all__ = ["RankProcess"]

_CHILD_MODULE = "accelerando.launchers._child"
# Seconds a process may take to end after SIGTERM before it is killed.
_STOP_GRACE_S = 10.0


class RankProcess:
    """Runs one process of the job and keeps its output until the driver reads it."""

    def __init__(self) -> None:
        self._child: subprocess.Popen[bytes] | None = None
        self._lines: deque[tuple[str, str]] = deque()
        self._readers: list[threading.Thread] = []

    def where(self) -> tuple[str, str, int]:
        """Return ``(node IP, Ray node id, pid)`` of this actor."""
        import ray

        context = ray.get_runtime_context()
        return ray.util.get_node_ip_address(), context.get_node_id(), os.getpid()

    def free_port(self) -> int:
        """Return a TCP port free on every interface of this machine a moment ago (the rendezvous port)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def start(self, kind: str, target: str, args: Sequence[str], env: Mapping[str, str], cwd: str) -> int:
        """Start the script (``kind``: ``script``, ``module`` or ``program``) with ``env`` added to this actor's.

        Args:
            kind: how ``target`` runs (as ``accelerando launch`` runs it).
            target: the script path, module name or program.
            args: the script's arguments.
            env: the process's variables (rank, rendezvous, settings).
            cwd: the folder to run in; this actor's own when it does not exist on this machine.

        Returns:
            The child's pid.

        Raises:
            OSError: the child cannot be started.
        """
        self.stop()
        self._lines.clear()
        argv = [sys.executable, "-u", "-m", _CHILD_MODULE, "-", str(os.getpid()), kind, target, *args]
        self._child = subprocess.Popen(  # noqa: S603 - the user's own command, as accelerando launch runs it
            argv,
            env={**os.environ, **env},
            cwd=cwd if os.path.isdir(cwd) else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._readers = [
            self._read_into("stdout", self._child.stdout),
            self._read_into("stderr", self._child.stderr),
        ]
        return self._child.pid

    def _read_into(self, stream: str, pipe: IO[bytes] | None) -> threading.Thread:
        def read() -> None:
            if pipe is None:
                return
            for raw in iter(pipe.readline, b""):
                self._lines.append((stream, raw.decode("utf-8", errors="replace")))
            pipe.close()

        thread = threading.Thread(target=read, name=f"rank-{stream}", daemon=True)
        thread.start()
        return thread

    def poll(self) -> tuple[list[tuple[str, str]], int | None]:
        """Return the output lines written since the last call (``(stream, text)``) and the exit status.

        The status is None while the process runs; once it has ended, every line it wrote is returned
        with it (or before it). A negative status is the signal that ended the process, as in subprocess.
        """
        child = self._child
        code = None if child is None else child.poll()
        if code is not None:
            for reader in self._readers:
                reader.join(timeout=5)
        lines = []
        while self._lines:
            lines.append(self._lines.popleft())
        return lines, code

    def pid(self) -> int | None:
        """The running child's pid, or None."""
        return None if self._child is None else self._child.pid

    def stop(self) -> int | None:
        """End the child (SIGTERM, then SIGKILL after a grace period); return its exit status, None if none ran."""
        child = self._child
        if child is None:
            return None
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        return child.returncode
