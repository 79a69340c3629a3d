"""Run commands from tests: stream their output live and fail with it when they fail.

``execute_subprocess_async`` is the reference's name; the work is done with two reader threads (one per
pipe) rather than an event loop, so it also runs inside a test that already has a running loop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

__all__ = ["SubprocessCallException", "execute_subprocess_async", "run_command"]


class SubprocessCallException(Exception):
    """A command run by :func:`run_command` exited with a non-zero status; the message holds its output."""


@dataclass
class _RunOutput:
    """What a finished command left: its exit status and its output lines (newlines stripped)."""

    returncode: int
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


def _as_strings(cmd: Sequence[object]) -> list[str]:
    # Callers build commands from pathlib paths; subprocess accepts them but " ".join does not.
    return [str(part) for part in cmd]


def _resolve_program(cmd: list[str]) -> list[str]:
    """Run ``accelerando ...`` through this interpreter when the console script is not on PATH."""
    if cmd and cmd[0] == "accelerando" and shutil.which("accelerando") is None:
        return [sys.executable, "-m", "accelerando", *cmd[1:]]
    return cmd


def _pump(pipe: IO[bytes], sink: list[str], echo_to: IO[str] | None, label: str) -> None:
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        sink.append(line)
        if echo_to is not None:
            print(f"{label}{line}", file=echo_to, flush=True)
    pipe.close()


def execute_subprocess_async(
    cmd: list,
    env: Mapping[str, str] | None = None,
    stdin: int | IO[bytes] | IO[str] | None = None,
    timeout: float | None = 180,
    quiet: bool = False,
    echo: bool = True,
) -> _RunOutput:
    """Run ``cmd``, echoing its stdout and stderr line by line as they come, and return its output.

    Args:
        cmd: the program and its arguments (``pathlib.Path`` items are accepted). A leading
            ``"accelerando"`` runs as ``python -m accelerando`` when the console script is not on PATH.
        env: the complete environment for the command (None: inherit this process's).
        stdin: passed to the child as its standard input (None: inherit).
        timeout: seconds to wait before the command is killed (None: no limit).
        quiet: do not echo the command's output (it is still collected).
        echo: print the command line before running it.

    Returns:
        An object with ``returncode`` and the ``stdout`` / ``stderr`` lists of lines.

    Raises:
        RuntimeError: the command exited with a non-zero status (or was killed by a signal) or ran past
            ``timeout``; the message names the command and holds its stderr and stdout.
    """
    argv = _resolve_program(_as_strings(cmd))
    cmd_str = " ".join(argv)
    if echo:
        print("\nRunning: ", cmd_str, flush=True)
    proc = subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
    )
    result = _RunOutput(returncode=0)
    readers = [
        threading.Thread(
            target=_pump, args=(proc.stdout, result.stdout, None if quiet else sys.stdout, ""), daemon=True
        ),
        threading.Thread(
            target=_pump,
            args=(proc.stderr, result.stderr, None if quiet else sys.stderr, "stderr: "),
            daemon=True,
        ),
    ]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        result.returncode = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.kill()
        result.returncode = proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    if timed_out:
        raise RuntimeError(f"'{cmd_str}' did not finish within {timeout}s and was killed.\n{_report(result)}")
    if result.returncode != 0:
        raise RuntimeError(f"'{cmd_str}' failed with returncode {result.returncode}\n{_report(result)}")
    return result


def _report(result: _RunOutput) -> str:
    stderr = "\n".join(result.stderr)
    stdout = "\n".join(result.stdout)
    return f"\n--- stderr of the command (all processes) ---\n{stderr}\n--- stdout ---\n{stdout}"


def run_command(
    command: list[str], return_stdout: bool = False, env: Mapping[str, str] | None = None
) -> str | None:
    """Run ``command`` to completion with stderr merged into stdout.

    Args:
        command: the program and its arguments (``pathlib.Path`` items are accepted).
        return_stdout: return the combined output as text.
        env: the complete environment for the command (None: a copy of this process's).

    Returns:
        The combined output when ``return_stdout``, else None.

    Raises:
        SubprocessCallException: the command exited with a non-zero status; the message holds its
            combined output.
    """
    argv = _resolve_program(_as_strings(command))
    try:
        output = subprocess.check_output(
            argv, stderr=subprocess.STDOUT, env=dict(env) if env is not None else os.environ.copy()
        )
    except subprocess.CalledProcessError as exc:
        text = exc.output.decode("utf-8", errors="replace") if exc.output else ""
        raise SubprocessCallException(
            f"Command `{' '.join(argv)}` failed with the following output:\n\n{text}"
        ) from exc
    if return_stdout:
        return output.decode("utf-8", errors="replace")
    return None
