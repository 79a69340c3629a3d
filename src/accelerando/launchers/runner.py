"""Execute a :class:`~accelerando.launchers.plan.LaunchPlan`.

One process is started directly with :mod:`subprocess`, or, for the command line (``accelerando
launch``), the launcher becomes the script (:func:`os.execvp`: one interpreter start-up, no process
left to wait or to orphan). Several are started by PyTorch's elastic
agent, called in this process (``torch.distributed.run``) so that a launch costs one interpreter
start-up less than ``torchrun`` in a subprocess would; torch is imported only here, never for
``--help`` or ``--dry-run``.

Every process dies with the launcher, whatever ended it (Linux's parent-death signal, set in the one
process of a simple launch before exec, and by :mod:`accelerando.launchers._child` in each process
the agent starts; a launcher that became its script has nothing to outlive it). A multi-process launch also runs a hang watchdog
(:mod:`accelerando.launchers.watchdog`) and, when processes fail, names the one that failed first.

Signals: SIGTERM, SIGINT, SIGHUP reach every process (the agent sends its processes the signal it got,
then SIGKILL after its shutdown timeout of 30 s; a simple launch forwards them to its one process).
SIGUSR1, SLURM's early warning, is passed on as SIGTERM to the agent's processes (to them SIGUSR1 asks
for a stack dump) and as SIGUSR1 to a simple launch's process. A process that checkpointed on
preemption (setting ``preemption_checkpoint``) exits with 143; the launch then exits with 143 too, the
status of a job stopped by SIGTERM, which SLURM and Kubernetes requeue or restart.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from accelerando.core.settings.fields import quote_value
from accelerando.launchers._child import set_parent_death_signal

# subprocess, logging and ctypes (the parent-death signal) load only for the launches that use them: a
# command-line one-process launch execs the script and needs none of them.
if TYPE_CHECKING:
    import argparse
    import subprocess
    from types import FrameType

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from accelerando.launchers.plan import LaunchPlan
    from accelerando.launchers.watchdog import FailureRecord, RunFolder, Watchdog

    # What ``signal.signal`` returns (typeshed's private ``_HANDLER``).
    _Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

__all__ = ["HANG_EXIT_CODE", "run", "write_deepspeed_env"]

#: exit status of a launch the hang watchdog stopped (as ``timeout(1)`` uses).
HANG_EXIT_CODE = 124
# The shim is started by its starter's path (python -u .../_start.py), not as a module: no accelerando
# package is imported in a process before its target (counted by tests/launchers/test_launch_startup_work.py).
_CHILD_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_start.py")


def _die_with(launcher_pid: int) -> Callable[[], None]:
    def _in_child() -> None:  # between fork and exec: the kernel keeps the request across exec
        set_parent_death_signal(launcher_pid)

    return _in_child


_FORWARDED = ("SIGTERM", "SIGHUP", "SIGUSR1")


def _forward_signals(child: subprocess.Popen[bytes]) -> dict[int, _Handler]:
    """Pass SIGTERM/SIGHUP/SIGUSR1 on to ``child`` (which may checkpoint); return the old handlers."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous: dict[int, _Handler] = {}
    for name in _FORWARDED:
        sig = getattr(signal, name, None)
        if sig is not None:
            previous[int(sig)] = signal.signal(sig, forward)
    return previous


def _exec_simple(plan: LaunchPlan) -> int:
    """Become the one process of ``plan`` (:func:`os.execvp`); return only when it cannot start (127).

    The script keeps the launcher's pid: it gets every signal sent to the launch itself, its exit
    status (or the signal that ended it) is the launch's, and no process of the launch can outlive it.
    """
    os.environ.update(plan.env)  # the script inherits the plan's variables, as a child would
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(plan.argv[0], list(plan.argv))
    except OSError as err:  # not found, not executable, ...: one line, as a shell would say it
        print(
            f"accelerando launch: cannot start {plan.argv[0]!r}: {err.strerror}. "
            "Fix: check that this program exists and is executable (with --no_python, the script itself).",
            file=sys.stderr,
        )
    return 127


def _run_simple(plan: LaunchPlan) -> int:
    import subprocess

    # The launcher is the one place that writes the processes' environment; the child inherits ours.
    os.environ.update(plan.env)
    # The script dies with the launcher, whatever ended the launcher (SIGKILL included).
    linux = sys.platform.startswith("linux")
    try:
        child = subprocess.Popen(list(plan.argv), preexec_fn=_die_with(os.getpid()) if linux else None)
    except FileNotFoundError as err:
        print(f"accelerando launch: cannot start {plan.argv[0]!r}: {err.strerror}.", file=sys.stderr)
        return 127
    previous = _forward_signals(child)
    try:
        return child.wait()
    except KeyboardInterrupt:
        if child.poll() is None:  # a SIGINT sent to the launcher alone: pass it on, then wait
            child.send_signal(signal.SIGINT)
        child.wait()
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _describe(failure: ProcessFailure) -> tuple[str, int]:
    """What happened to one failed process, and the exit status that stands for it."""
    if failure.exitcode < 0:  # killed by a signal: there is no traceback to point at
        number = -failure.exitcode
        name = signal.Signals(number).name if number in signal.valid_signals() else "?"
        return f"was killed by signal {number} ({name})", 128 + number
    return f"failed with exit code {failure.exitcode}", failure.exitcode or 1


# How late the agent may see a killed process after its peer's collective already failed.
_PEER_LOSS_GRACE_S = 5
# Messages of the errors a collective raises when the process on the other side is gone.
_PEER_LOSS_MARKS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote worker crash",
)


def _is_peer_loss(record: FailureRecord) -> bool:
    return any(mark in str(record.get("message", "")).lower() for mark in _PEER_LOSS_MARKS)


def _first_failure(err: ChildFailedError, records: Mapping[int, FailureRecord]) -> tuple[int, ProcessFailure]:
    """The failure to blame: the earliest; among those seen at once, a kill, then an error, then SIGTERM.

    The agent stamps failures in whole seconds when it sees them, so a process killed outright and a
    peer that then raised because its connection closed often share a second; the kill is the likelier
    cause. SIGTERM is what the agent sends the processes left after a failure, so it is the least likely
    cause. Between two errors, the nanosecond time each process recorded when its exception reached the
    top (``records``, written by :mod:`accelerando.launchers._child`) decides: the process that raised
    first is the cause, the peer whose collective then failed is its victim.
    """
    failures = err.failures

    def order(item: tuple[int, ProcessFailure]) -> tuple[int, int, int, int]:
        rank, failure = item
        record = records.get(rank)
        if record is not None:  # it raised then, however its exit ended (the agent may SIGTERM its teardown)
            seconds = record["time_ns"] // 1_000_000_000
            if _is_peer_loss(record):
                # A collective that failed because its peer vanished is a victim: a process the agent
                # saw killed within the next seconds (its poll is late on a busy machine) is the cause.
                seconds += _PEER_LOSS_GRACE_S
            return (seconds, 1, record["time_ns"], rank)
        if failure.exitcode >= 0:
            kind = 1
        else:
            kind = 2 if -failure.exitcode == signal.SIGTERM else 0
        return (failure.timestamp, kind, 0, rank)

    return min(failures.items(), key=order)


def _report_failure(err: ChildFailedError, records: Mapping[int, FailureRecord] | None = None) -> int:
    """Print one line naming the failed processes, the likely cause first; return the exit status.

    Args:
        err: the agent's ``ChildFailedError`` (its ``failures``: rank -> ``ProcessFailure``).
        records: rank -> the uncaught exception each process recorded (see :class:`RunFolder`).
    """
    records = records or {}
    rank, failure = _first_failure(err, records)
    what, code = _describe(failure)
    record = records.get(rank)
    if record is not None:
        # The exception line itself is in the traceback above; name it without repeating it.
        raised = f"{record.get('type')} at {record.get('where')}, {quote_value(record.get('message'))}"
        if failure.exitcode >= 0:
            what += f" ({raised}); its traceback is above"
        else:  # stopped by the agent while it was exiting after the error
            what, code = f"raised an exception ({raised}) and then {what}; its traceback is above", 1
    elif failure.exitcode >= 0:
        what += "; its traceback is above"
    others = [
        f"process {other} {_describe(each)[0]}"
        for other, each in sorted(err.failures.items())
        if other != rank
    ]
    also = f" Also: {'; '.join(others)}." if others else ""
    print(
        f"accelerando launch: process {rank} (local rank {failure.local_rank}, pid {failure.pid}) {what}."
        f"{also} {1 + len(others)} process(es) failed in all.",
        file=sys.stderr,
    )
    return code


def _through_child(args: argparse.Namespace, run_dir: str) -> argparse.Namespace:
    """Have the agent start each process through :mod:`accelerando.launchers._child`.

    The target (a script, a module, a ``--no_python`` program) and its arguments become the shim's
    arguments; the shim prepares the process (death with the launcher, stack dumps, failure
    records) and then runs the target as the agent would have.
    """
    kind = "program" if args.no_python else "module" if args.module else "script"
    args.training_script_args = [run_dir, str(os.getpid()), kind, args.training_script,
                                 *args.training_script_args]  # fmt: skip
    args.training_script, args.module, args.no_python = _CHILD_FILE, False, False
    return args


def _run_elastic(plan: LaunchPlan, quiet: bool) -> int:
    import logging
    import tempfile

    from torch.distributed.run import parse_args
    from torch.distributed.run import run as elastic_run

    # The launcher is the one place that writes the processes' environment; the agent copies ours.
    os.environ.update(plan.env)
    # The agent's own failure log line repeats what _report_failure prints, and its INFO/WARNING lines
    # are noise for a user; the processes' output and tracebacks are untouched.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    args = parse_args(plan.agent_args)
    if hasattr(signal, "SIGUSR1"):  # the agent stops its processes as for SIGTERM (see the module docstring)
        signal.signal(signal.SIGUSR1, _usr1_as_sigterm)
    # Launch mode chosen at run time: only a multi-process launch needs these (a one-process launch
    # execs the script and imports no more than it must).
    from accelerando.launchers.bound_rendezvous import bound_rendezvous
    from accelerando.launchers.watchdog import RunFolder, Watchdog

    # The rendezvous store listens on the launch's bind address only (loopback on one machine).
    if os.name != "posix":  # no shim: no parent-death signal, stack dumps or records there
        with bound_rendezvous(plan.bind_address):
            return _wait_elastic(lambda: elastic_run(args), None, None)
    with (
        bound_rendezvous(plan.bind_address),
        tempfile.TemporaryDirectory(prefix="accelerando-run-") as run_dir,
    ):
        folder = RunFolder(run_dir)
        watchdog = Watchdog(folder, plan.hang_timeout_s) if plan.hang_timeout_s > 0 else None
        if watchdog is not None:
            watchdog.start()
        try:
            return _wait_elastic(lambda: elastic_run(_through_child(args, run_dir)), folder, watchdog)
        finally:
            if watchdog is not None:
                watchdog.stop()


def _usr1_as_sigterm(_signum: int, _frame: FrameType | None) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    raise SignalException(f"Process {os.getpid()} got signal: SIGUSR1", sigval=signal.SIGTERM)


def _wait_elastic(start: Callable[[], None], folder: RunFolder | None, watchdog: Watchdog | None) -> int:
    """Run the agent until the processes end; report how they ended and return the exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        start()
    except ChildFailedError as err:
        if watchdog is not None and watchdog.report is not None:
            print(watchdog.report.describe(), file=sys.stderr)
            return HANG_EXIT_CODE
        return _report_failure(err, folder.failures() if folder is not None else None)
    except SignalException as err:  # the agent stopped the processes after SIGTERM/SIGINT/...
        print(f"accelerando launch: stopped by signal {err.sigval.name}.", file=sys.stderr)
        return 128 + int(err.sigval)
    except KeyboardInterrupt:
        return 130
    return 0


def run(plan: LaunchPlan, *, quiet: bool = False, replace_process: bool = False) -> int:
    """Start the processes of ``plan`` and wait for them.

    Args:
        plan: built by :func:`accelerando.launchers.plan.build`.
        quiet: silence the elastic agent's own log lines.
        replace_process: for a one-process (``"simple"``) plan on a POSIX system, replace this
            process by the script (:func:`os.execvp`) instead of starting it as a child and waiting:
            the call does not return unless the program cannot be found (127). Only for the
            command line (``accelerando launch``): it ends the calling program.

    Returns:
        The exit status: the script's for one process; 0 when every process succeeded, else the
        exit code of the first process that failed; 2 when the rendezvous address or port of a
        multi-process launch cannot work (:mod:`accelerando.launchers.preflight`, checked first).
        ``os.environ`` is the same afterwards as before.
    """
    interfaces: dict[str, str] = {}
    if plan.mode == "elastic":  # a wrong address or a taken port fails here, not as a hang
        from accelerando.launchers.preflight import RendezvousError, check_plan, socket_interfaces

        try:
            warnings = check_plan(plan)
        except RendezvousError as err:
            print(f"accelerando launch: {err}", file=sys.stderr)
            return 2
        for warning in warnings if not quiet else ():
            print(f"accelerando launch: warning: {warning}.", file=sys.stderr)
        interfaces = socket_interfaces(
            plan, os.environ
        )  # gloo's, on several machines, where its own is wrong
    # One process, mpirun (one command that starts them all), or DeepSpeed's own runner; every other
    # plan goes to the elastic agent.
    simple = _exec_simple if replace_process and os.name == "posix" else _run_simple
    direct = {"simple": simple, "mpirun": _run_simple, "deepspeed": _run_deepspeed}.get(plan.mode)
    # The processes inherit the plan's variables through our environment; it is put back afterwards, so
    # a launch run from Python (launch_command, `accelerando test`) leaves the caller's as it was.
    saved = os.environ.copy()
    os.environ.update(interfaces)
    try:
        return direct(plan) if direct is not None else _run_elastic(plan, quiet)
    finally:
        for name in set(os.environ) - set(saved):
            del os.environ[name]
        os.environ.update(saved)


def write_deepspeed_env(env: Mapping[str, object], path: str) -> None:
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
                f"the variable {key} holds a newline, which a multi-machine DeepSpeed launch cannot pass to "
                f"the other machines (it writes one KEY=VALUE line each). Fix: set {key} without newlines."
            )
        lines.append(f"{key}={value}")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def _run_deepspeed(plan: LaunchPlan) -> int:
    import subprocess
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
