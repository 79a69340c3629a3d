"""Multi-CPU jobs started through ``mpirun`` (``--mpirun_hostfile``, ``mpirun_config`` in a config file).

``mpirun`` starts every process on the hosts of a hostfile; each process learns its rank and world
size from the MPI implementation's variables (:class:`accelerando.core.environments.MPIEnvironment`) and
meets the others at ``MASTER_ADDR:MASTER_PORT``, which the launcher exports. The options differ by
implementation, so the installed one is recognised from ``mpirun --version``:

* Open MPI: ``mpirun --hostfile FILE -np TOTAL --npernode PER_HOST`` (with ``-x NAME`` for every
  variable the processes need, since Open MPI does not forward the environment to other hosts);
* MPICH and Intel MPI (Hydra): ``mpirun -f FILE -ppn PER_HOST -n TOTAL`` (Hydra forwards the
  environment itself).

Only the standard library is used; nothing here starts the job (see
:mod:`accelerando.launchers.runner`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["MpiRun", "FLAVOURS", "detect_mpirun", "flavour_of", "mpirun_argv"]

#: The MPI implementations whose ``mpirun`` options are known.
FLAVOURS = ("openmpi", "mpich", "intelmpi")

_INSTALL_HINT = (
    "install an MPI implementation (Open MPI: `apt-get install openmpi-bin`; or MPICH, or Intel MPI "
    "with its setvars.sh sourced), or drop --mpirun_hostfile (mpirun_config.mpirun_hostfile)"
)


@dataclass(frozen=True, slots=True)
class MpiRun:
    """The ``mpirun`` program found on this machine.

    Attributes:
        path: the executable.
        flavour: one of :data:`FLAVOURS`.
    """

    path: str
    flavour: str


def flavour_of(version_text: str) -> str | None:
    """Recognise the MPI implementation from the output of ``mpirun --version``.

    Args:
        version_text: what ``mpirun --version`` printed.

    Returns:
        ``"openmpi"``, ``"intelmpi"``, ``"mpich"``, or None when the text names none of them.
    """
    text = version_text.lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "intel(r) mpi" in text or "intel mpi" in text:
        return "intelmpi"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    return None


def detect_mpirun(
    which: Callable[[str], str | None] | None = None,
    version: Callable[[str], str] | None = None,
) -> MpiRun:
    """Find ``mpirun`` on ``PATH`` and recognise its implementation.

    Args:
        which: finds an executable like :func:`shutil.which` (a test passes a fake; default: that).
        version: returns the ``--version`` output of the given executable (default: runs it).

    Returns:
        The :class:`MpiRun`.

    Raises:
        ValueError: ``mpirun`` is not on ``PATH``, cannot be run, or is of an unknown implementation;
            the message says how to fix it.
    """
    # shutil and subprocess load only here: every launch imports this module, few run mpirun.
    import shutil
    import subprocess

    path = (which or shutil.which)("mpirun")
    if path is None:
        raise ValueError(
            f"--mpirun_hostfile starts the job with mpirun, but mpirun is not on PATH. Fix: {_INSTALL_HINT}."
        )
    try:
        text = (version or _version_text)(path)
    except (OSError, subprocess.SubprocessError) as err:
        raise ValueError(f"{path} --version failed ({err}). Fix: {_INSTALL_HINT}.") from None
    flavour = flavour_of(text)
    if flavour is None:
        first = text.strip().splitlines()[0] if text.strip() else "no output"
        raise ValueError(
            f"{path} is an MPI implementation accelerando does not know ({first!r}); it knows Open MPI, "
            f"MPICH and Intel MPI. Fix: put one of them first on PATH, or drop --mpirun_hostfile."
        )
    return MpiRun(path, flavour)


def _version_text(path: str) -> str:
    import subprocess

    done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    return done.stdout + done.stderr


def mpirun_argv(
    mpirun: MpiRun,
    hostfile: str,
    total: int,
    per_host: int,
    forward: Iterable[str] = (),
    *,
    as_root: bool | None = None,
) -> list[str]:
    """The ``mpirun`` part of the command line (the program to run comes after it).

    Args:
        mpirun: the detected ``mpirun``.
        hostfile: the hostfile (``--mpirun_hostfile``).
        total: processes on all hosts.
        per_host: processes on each host.
        forward: variables the processes need on every host (Open MPI forwards only those named).
        as_root: whether the launcher runs as root (Open MPI then needs ``--allow-run-as-root``);
            None asks the operating system.

    Returns:
        ``[mpirun, options...]``.
    """
    if mpirun.flavour != "openmpi":
        # The reference's order, so its users see (and its tests read) the same command line.
        return [mpirun.path, "-f", hostfile, "-ppn", str(per_host), "-n", str(total)]
    argv = [mpirun.path, "--hostfile", hostfile, "-np", str(total), "--npernode", str(per_host)]
    root = as_root if as_root is not None else hasattr(os, "geteuid") and os.geteuid() == 0
    if root:
        argv.append(
            "--allow-run-as-root"
        )  # Open MPI refuses root otherwise; the user chose to launch as root
    for name in sorted(set(forward)):
        argv += ["-x", name]
    return argv
