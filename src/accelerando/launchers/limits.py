"""Bounds a launch checks before it starts anything: what it echoes, what it execs, how many processes.

- :func:`clip`: ``--dry_run`` shows at most :data:`ECHO_LIMIT` characters of any one value, then
  ``... (N bytes)``: a 200 MB config value is not printed twice over.
- :func:`check_exec_size`: the operating system refuses to start a program whose single argument or
  environment string, or whose whole argument list and environment, is too large, with a bare
  ``OSError: Argument list too long``; this check names the value and the fix first.
- :func:`check_process_count`: more processes on one machine than :data:`MAX_PROCESSES_PER_MACHINE`,
  or than the machine lets this user start, is refused before any starts.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping, Sequence

__all__ = [
    "ARG_STRING_MAX",
    "ECHO_LIMIT",
    "MAX_PROCESSES_PER_MACHINE",
    "check_exec_size",
    "check_process_count",
    "clip",
    "process_limit",
]

#: Characters of one value that ``--dry_run`` prints before cutting it.
ECHO_LIMIT = 1000
#: Linux's MAX_ARG_STRLEN: the longest single argument or ``NAME=value`` string ``execve`` accepts.
ARG_STRING_MAX = 32 * 4096
#: Room left under ``ARG_MAX`` for what the elastic agent adds to each process's environment.
_EXEC_MARGIN = 16 * 1024
#: The most processes one machine may start in a launch, whatever the machine allows.
MAX_PROCESSES_PER_MACHINE = 4096


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """Return ``text`` when at most ``limit`` characters, else its start then ``... (N bytes)``.

    Args:
        text: the value to show.
        limit: the most characters shown.

    Example:
        >>> clip("x" * 5000, limit=3)
        'xxx... (5000 bytes)'
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text.encode('utf-8', 'surrogateescape'))} bytes)"


def _arg_max() -> int:
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):  # pragma: no cover - every POSIX system has it
        return 2 * 2**20
    return value if value > 0 else 2 * 2**20


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape")) + 1  # the terminating NUL


def check_exec_size(
    argv: Sequence[str],
    env: Mapping[str, str],
    environ: Mapping[str, str] | None = None,
    *,
    names: Mapping[str, str] | None = None,
) -> None:
    """Check that the processes' command line and environment fit what ``execve`` accepts.

    Args:
        argv: the command line to start.
        env: the variables the launch adds to the environment.
        environ: the environment they are added to (default: ``os.environ``).
        names: for a variable of ``env``, the setting it carries and where that came from (to name it).

    Raises:
        ValueError: one string is longer than :data:`ARG_STRING_MAX` bytes, or all together exceed
            ``ARG_MAX``; the message names the largest value, its size and the fix.
    """
    merged = {**(os.environ if environ is None else environ), **env}
    items: list[tuple[int, str]] = [(_size(a), f"command-line argument {i}") for i, a in enumerate(argv)]
    for key, value in merged.items():
        what = f"environment variable {key}"
        if names and key in names:
            what += f" ({names[key]})"
        elif key not in env:
            what += " (of the launcher's own environment)"
        items.append((_size(f"{key}={value}"), what))
    largest, what = max(items) if items else (0, "")
    fix = (
        "Fix: pass a shorter value; for large data, pass the path of a file the script reads "
        "(`unset` it first if it is a variable of your shell)."
    )
    if largest > ARG_STRING_MAX:
        raise ValueError(
            f"the {what} is {largest - 1} bytes; the operating system starts no process with a single "
            f"argument or environment value over {ARG_STRING_MAX} bytes (Argument list too long). {fix}"
        )
    total = sum(size + 8 for size, _ in items)  # each string plus its pointer
    limit = _arg_max() - _EXEC_MARGIN
    if total > limit:
        raise ValueError(
            f"the command line and environment of the processes total {total} bytes, over the {limit} the "
            f"operating system accepts (ARG_MAX less room for the launcher's own variables); the largest "
            f"is the {what} ({largest - 1} bytes). {fix}"
        )


def process_limit() -> int | None:
    """The most processes this user may start on this machine (``RLIMIT_NPROC``, ``pid_max``), or None."""
    limits: list[int] = []
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY and soft > 0:
            limits.append(int(soft))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not on every platform
        pass
    try:
        with open("/proc/sys/kernel/pid_max", encoding="ascii") as handle:
            limits.append(int(handle.read(32).strip()))
    except (OSError, ValueError):
        pass
    return min(limits) if limits else None


def check_process_count(per_node: int, where: str, limit: int | None = None) -> None:
    """Refuse an absurd number of processes on one machine before any starts.

    Args:
        per_node: processes this launch starts on each machine.
        where: the setting that asked for them, with its source (for the message).
        limit: the machine's own bound (default: :func:`process_limit`).

    Raises:
        ValueError: ``per_node`` is above :data:`MAX_PROCESSES_PER_MACHINE` or the machine's limit; the
            message names the number and the fix.
    """
    machine = process_limit() if limit is None else limit
    bound = MAX_PROCESSES_PER_MACHINE if machine is None else min(MAX_PROCESSES_PER_MACHINE, machine)
    if per_node > bound:
        reason = (
            f"this machine lets this user start at most {machine} processes"
            if machine is not None and machine < MAX_PROCESSES_PER_MACHINE
            else f"accelerando starts at most {MAX_PROCESSES_PER_MACHINE} processes per machine"
        )
        raise ValueError(
            f"{where} asks for {per_node} processes on one machine, but {reason}. Fix: pass a smaller "
            "--num_processes (usually one per GPU or a few per CPU socket), or spread them over machines "
            "with --num_machines."
        )
