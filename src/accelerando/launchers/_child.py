"""The first code each process of a multi-process launch runs, before the user's script.

``accelerando launch`` starts every process as ``python -u .../accelerando/launchers/_start.py RUN_DIR
LAUNCHER_PID KIND TARGET [ARGS...]`` (KIND: ``script``, ``module`` or ``program``), which runs this
module without importing the accelerando package (:mod:`accelerando.launchers._start`);
``python -m accelerando.launchers._child`` works the same. In this process, before the target runs, it:

1. asks the kernel to SIGKILL it when the launcher dies (Linux ``PR_SET_PDEATHSIG``), so that a
   launcher killed by any signal, SIGKILL included, leaves no process behind to go on writing into
   the run's folders; a launcher already gone by then ends the process at once;
2. writes ``RUN_DIR/rank<N>.pid`` and registers a stack dump of every thread on SIGUSR1 into
   ``RUN_DIR/rank<N>.stack`` (the launcher's watchdog sends it to a job that stopped progressing);
3. records an uncaught exception, with a nanosecond time stamp, in ``RUN_DIR/rank<N>.failure.json``
   (so the launcher names the process that failed first, not a peer that failed because of it), and
   tells accelerando's process-group teardown not to wait for its peers when the target ends with a
   failing ``SystemExit`` (a peer waiting in a collective for it would never come: the launcher
   then ends the job at once, instead of after the teardown's 30 s);
4. with ``ACCELERANDO_INSTALL_AS_ACCELERATE`` true (``accelerando launch --install_as_accelerate``),
   calls :func:`accelerando.core.stand_in.install_as_accelerate` so that ``import accelerate`` anywhere in
   the process gets accelerando.

RUN_DIR ``-`` skips steps 2-3 and LAUNCHER_PID ``0`` skips step 1: a one-process or ``mpirun`` launch
comes through here only for step 4 (its launcher sets the death signal itself, or cannot).

Then it runs the target as Python would: a script with :func:`runpy.run_path` (``__main__``,
``sys.argv`` and ``sys.path[0]`` as ``python script.py`` sets them), a module with
:func:`runpy.run_module`, a program (``--no_python``) with :func:`os.execvp`. Exit codes and
tracebacks are the target's; the frames of this module and of :mod:`runpy` are left out of a
traceback. Only the standard library is imported here (accelerando's stand-in only when asked for).
"""

from __future__ import annotations

import _thread
import ctypes
import faulthandler
import os
import runpy
import signal
import sys
import time

# Only the type checker reads these: typing (and the re it imports) would double the shim's start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType
    from typing import IO

__all__ = ["INSTALL_ENV", "SHIM_FILES", "main", "install_if_asked", "set_parent_death_signal"]

#: Set to a true value by the launcher for ``--install_as_accelerate``.
INSTALL_ENV = "ACCELERANDO_INSTALL_AS_ACCELERATE"
_TRUE = frozenset({"1", "true", "yes", "y", "on", "t"})
_PR_SET_PDEATHSIG = 1
_KINDS = ("script", "module", "program")
_MESSAGE_LIMIT = 300
_HERE = os.path.dirname(os.path.realpath(__file__))
# Frames of this module, its starter and runpy, which start every traceback of the target (runpy is frozen).
SHIM_FILES = (
    os.path.abspath(__file__),
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "_start.py"),
    os.path.abspath(runpy.__file__),
    "<frozen runpy>",
)
_stack_file: IO[str] | None = None  # kept open: faulthandler writes to its descriptor


def set_parent_death_signal(launcher_pid: int, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux only).

    Args:
        launcher_pid: the process expected to be the parent. When the parent is already another
            process (the launcher died before this call), this process kills itself with ``sig``.
        sig: the signal to receive.

    Returns:
        True when the request is in place; False on systems without ``prctl`` (nothing is done).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != launcher_pid:  # orphaned before the request took effect
        os.kill(os.getpid(), sig)
    return True


def _rank() -> str:
    value = os.environ.get("RANK", "0")
    return value if value.isdigit() else "0"


def _where(tb: TracebackType | None) -> str:
    import traceback  # json and traceback load only when the target raised: not before its first line

    frames = traceback.extract_tb(tb)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _is_shim(filename: str) -> bool:
    return filename in SHIM_FILES or os.path.abspath(filename) in SHIM_FILES


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    while tb is not None and _is_shim(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _install_failure_record(path: str) -> None:
    previous = sys.excepthook

    def _record(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        tb = _user_frames(tb)
        if tb is not None:  # the default hook prints the exception's own traceback, not its argument
            value = value.with_traceback(tb)
        record = {
            "time_ns": time.time_ns(),
            "type": kind.__name__,
            "message": str(value)[:_MESSAGE_LIMIT],
            "where": _where(tb),
        }
        try:
            import json

            with open(path, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
        except OSError:
            pass  # the record only improves the launcher's summary; the traceback still prints
        previous(kind, value, tb)

    sys.excepthook = _record


def install_if_asked(environ: Mapping[str, str] | None = None) -> bool:
    """Install accelerando as ``accelerate`` in this process when the launcher asked for it.

    Args:
        environ: the environment to read (default: ``os.environ``).

    Returns:
        True when installed (``ACCELERANDO_INSTALL_AS_ACCELERATE`` is true), False otherwise.

    Raises:
        accelerando.core.stand_in.AccelerateAlreadyImportedError: the real ``accelerate`` is already imported.
    """
    env = os.environ if environ is None else environ
    if env.get(INSTALL_ENV, "").strip().lower() not in _TRUE:
        return False
    # Imported only when asked for: the stand-in loads importlib.metadata (a third of a launch's start-up),
    # and every launch imports this module (the launcher, and each process's shim); counted by
    # tests/launchers/test_launch_startup_work.py.
    from accelerando.core.stand_in import install_as_accelerate

    install_as_accelerate()
    return True


def _prepare(run_dir: str, launcher_pid: int, kind: str) -> None:
    global _stack_file
    if launcher_pid:
        set_parent_death_signal(launcher_pid)
    if run_dir == "-":
        return
    base = os.path.join(run_dir, f"rank{_rank()}")
    # A program (--no_python) replaces this interpreter: no stack dump (SIGUSR1 would end it) and no
    # record; its thread id 0 tells the launcher so.
    # The shim runs in the main thread: its id is the main thread's (without threading's import).
    main_thread = _thread.get_ident() if kind != "program" else 0
    try:
        if main_thread:
            _stack_file = open(base + ".stack", "w", encoding="utf-8")  # noqa: SIM115 - lives with us
            faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True)
        with open(base + ".pid", "w", encoding="ascii") as handle:
            handle.write(f"{os.getpid()} {main_thread}\n")
    except (OSError, AttributeError, ValueError):
        pass  # no watchdog data (a read-only folder, or no SIGUSR1 here): the job still runs
    try:
        os.unlink(base + ".failure.json")  # left by this rank before an agent restart: not ours
    except OSError:
        pass
    _install_failure_record(base + ".failure.json")


def _run(kind: str, target: str, args: list[str]) -> dict[str, object]:
    if kind == "program":
        try:
            os.execvp(target, [target, *args])
        except OSError as err:
            print(f"accelerando launch: cannot start {target!r}: {err.strerror}.", file=sys.stderr)
            raise SystemExit(127) from None
    sys.argv = [target, *args]
    if kind == "module":
        return runpy.run_module(target, run_name="__main__", alter_sys=True)
    # As ``python script.py``: the script's folder first on the path, not this process's working folder.
    sys.path[0] = os.path.dirname(os.path.abspath(target))
    if not (target.endswith(".py") and os.path.isfile(target)):  # a folder, a zip file, byte code
        return runpy.run_path(target, run_name="__main__")
    # What runpy.run_path does for a source file, without the pkgutil it imports for the other cases
    # (pkgutil imports typing and re: a third of the shim's start-up, before the script's first line).
    with open(os.path.abspath(target), "rb") as handle:
        code = compile(handle.read(), target, "exec")
    return runpy._run_module_code(code, None, "__main__", None, "", target)  # noqa: SLF001  # pyright: ignore[reportAttributeAccessIssue]


def _is_failing(code: object) -> bool:
    """Whether ``SystemExit(code)`` ends the process with a non-zero status (as Python maps it)."""
    return code is not None and (not isinstance(code, int) or code != 0)


def _release_peers() -> None:
    """Tell the process group's exit-time teardown not to wait for peers (a failing ``SystemExit``).

    Python calls no exception hook for a ``SystemExit``, so the teardown cannot tell ``sys.exit(3)``
    from a clean end; it would wait its whole shutdown timeout (30 s) for a peer that waits in a
    collective for this process and never comes. Looked up, not imported: a process that never
    started a group has nothing to tear down, and the shim imports only the standard library.
    """
    group = sys.modules.get("accelerando.core.process_group")
    if group is not None:
        group.mark_failed()


def main(argv: list[str] | None = None) -> None:
    """Prepare this process (see the module docstring), then run the target.

    Args:
        argv: ``RUN_DIR LAUNCHER_PID KIND TARGET [ARGS...]`` (default: ``sys.argv[1:]``).

    Raises:
        SystemExit: 2 for a malformed command line (only the launcher writes it); otherwise
            whatever the target raises.
    """
    if sys.path and os.path.realpath(sys.path[0]) == _HERE:  # started by _start.py: not the target's folder
        sys.path[0] = os.getcwd()  # as `python -m` sets it; a script's own folder replaces it in _run
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 4 or argv[2] not in _KINDS or not argv[1].isdigit():
        print("usage: python -m accelerando.launchers._child RUN_DIR LAUNCHER_PID KIND TARGET [ARGS...]",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    run_dir, launcher_pid, kind, target, *args = argv
    _prepare(run_dir, int(launcher_pid), kind)
    if kind != "program":  # a program replaces this interpreter: nothing installed here would reach it
        install_if_asked()
    try:
        _run(kind, target, args)
    except SystemExit as exiting:
        if _is_failing(exiting.code):
            _release_peers()
        raise


if __name__ == "__main__":
    main()
