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


def _report_failure(err: BaseException) -> int:
    """Print one line about the first failed process and return the exit status to use."""
    rank, failure = err.get_first_failure()  # type: ignore[attr-defined]
    where = f"process {rank} (local rank {failure.local_rank}, pid {failure.pid})"
    count = len(err.failures)  # type: ignore[attr-defined]
    if failure.exitcode < 0:  # killed by a signal: there is no traceback to point at
        name = signal.Signals(-failure.exitcode).name if -failure.exitcode in signal.valid_signals() else "?"
        what, code = f"was killed by signal {-failure.exitcode} ({name})", 128 - failure.exitcode
    else:
        what, code = (
            f"failed with exit code {failure.exitcode}; its traceback is above",
            failure.exitcode or 1,
        )
    print(f"accelerando launch: {where} {what}. {count} process(es) failed in all.", file=sys.stderr)
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
    if plan.mode == "simple":
        return _run_simple(plan)
    if plan.mode == "deepspeed":
        return _run_deepspeed(plan)
    return _run_elastic(plan, quiet)


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
