"""Execute a :class:`~accelerando.launchers.plan.LaunchPlan`.

One process is started directly with :mod:`subprocess`. Several are started by PyTorch's elastic
agent, called in this process (``torch.distributed.run``) so that a launch costs one interpreter
start-up less than ``torchrun`` in a subprocess would; torch is imported only here, never for
``--help`` or ``--dry-run``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import Any

from accelerando.launchers.plan import LaunchPlan

__all__ = ["run", "write_deepspeed_env"]


def _run_simple(plan: LaunchPlan) -> int:
    # The launcher is the one place that writes the processes' environment; the child inherits ours.
    os.environ.update(plan.env)
    try:
        return subprocess.run(list(plan.argv), check=False).returncode
    except FileNotFoundError as err:
        print(f"accelerando launch: cannot start {plan.argv[0]!r}: {err.strerror}.", file=sys.stderr)
        return 127
    except KeyboardInterrupt:
        return 130


def _describe(failure: Any) -> tuple[str, int]:
    """What happened to one failed process, and the exit status that stands for it."""
    if failure.exitcode < 0:  # killed by a signal: there is no traceback to point at
        number = -failure.exitcode
        name = signal.Signals(number).name if number in signal.valid_signals() else "?"
        return f"was killed by signal {number} ({name})", 128 + number
    return f"failed with exit code {failure.exitcode}", failure.exitcode or 1


def _first_failure(err: BaseException) -> tuple[int, Any]:
    """The failure to blame: the earliest; among those seen at once, a kill, then an error, then SIGTERM.

    The agent stamps failures without an error file in whole seconds when it sees them, so a
    process killed outright and a peer that then raised because its connection closed often share
    a timestamp; the kill is the likelier cause. SIGTERM is what the agent sends the processes left
    after a failure, so it is the least likely cause.
    """
    failures: dict[int, Any] = err.failures  # type: ignore[attr-defined]

    def order(item: tuple[int, Any]) -> tuple[int, int, int]:
        rank, failure = item
        if failure.exitcode >= 0:
            kind = 1
        else:
            kind = 2 if -failure.exitcode == signal.SIGTERM else 0
        return (failure.timestamp, kind, rank)

    return min(failures.items(), key=order)


def _report_failure(err: BaseException) -> int:
    """Print one line naming the failed processes, the likely cause first; return the exit status."""
    rank, failure = _first_failure(err)
    what, code = _describe(failure)
    if failure.exitcode >= 0:
        what += "; its traceback is above"
    others = [
        f"process {other} {_describe(each)[0]}"
        for other, each in sorted(err.failures.items())  # type: ignore[attr-defined]
        if other != rank
    ]
    also = f" Also: {'; '.join(others)}." if others else ""
    print(
        f"accelerando launch: process {rank} (local rank {failure.local_rank}, pid {failure.pid}) {what}."
        f"{also} {1 + len(others)} process(es) failed in all.",
        file=sys.stderr,
    )
    return code


def _run_elastic(plan: LaunchPlan, quiet: bool) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args
    from torch.distributed.run import run as elastic_run

    # The launcher is the one place that writes the processes' environment; the agent copies ours.
    os.environ.update(plan.env)
    # The agent's own failure log line repeats what _report_failure prints, and its INFO/WARNING lines
    # are noise for a user; the processes' output and tracebacks are untouched.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        elastic_run(parse_args(plan.agent_args))
    except ChildFailedError as err:
        return _report_failure(err)
    except SignalException as err:  # the agent stopped the processes after SIGTERM/SIGINT/...
        print(f"accelerando launch: stopped by signal {err.sigval.name}.", file=sys.stderr)
        return 128 + int(err.sigval)
    except KeyboardInterrupt:
        return 130
    return 0


def run(plan: LaunchPlan, *, quiet: bool = False) -> int:
    """Start the processes of ``plan`` and wait for them.

    Args:
        plan: built by :func:`accelerando.launchers.plan.build`.
        quiet: silence the elastic agent's own log lines.

    Returns:
        The exit status: the script's for one process; 0 when every process succeeded, else the
        exit code of the first process that failed.
    """
    # One process, or DeepSpeed's own runner; every other plan goes to the elastic agent.
    direct = {"simple": _run_simple, "deepspeed": _run_deepspeed}.get(plan.mode)
    return direct(plan) if direct is not None else _run_elastic(plan, quiet)


def write_deepspeed_env(env: dict[str, str] | Any, path: str) -> None:
    """Write ``env`` as DeepSpeed's ``.deepspeed_env`` file (``KEY=VALUE`` lines).

    DeepSpeed's multi-node runner exports the variables listed there on every host; without it
    the settings the launcher resolved would reach only this machine's processes.

    Raises:
        ValueError: a value contains a newline (it would corrupt the file).
    """
    lines = []
    for key, value in sorted(env.items()):
        if "\n" in str(value):
            raise ValueError(
                f"environment value of {key} contains a newline; DeepSpeed's env file cannot carry it"
            )
        lines.append(f"{key}={value}")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def _run_deepspeed(plan: LaunchPlan) -> int:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="accelerando-ds-") as folder:
        env_file = os.path.join(folder, ".deepspeed_env")
        write_deepspeed_env(dict(plan.env), env_file)
        # DeepSpeed joins DS_ENV_FILE onto its search folders; an absolute path is used as is.
        os.environ.update({**plan.env, "DS_ENV_FILE": env_file})
        try:
            return subprocess.run(list(plan.argv), check=False).returncode
        except KeyboardInterrupt:
            return 130
