"""A Ray job's entrypoint script for a :class:`~accelerando.launchers.emit.JobSpec` (``--emit ray``).

Submitted with ``ray job submit --address http://HEAD:8265 --working-dir . -- bash job.sh``, the
script runs on the cluster's head node inside the job, where Ray sets ``RAY_ADDRESS``; it runs
``accelerando launch --ray`` there, which connects to that cluster (``--ray`` alone: Ray's own choice)
and starts the job's ``num_processes`` processes as Ray actors wherever the cluster has room
(:mod:`accelerando.launchers.ray`). Every setting some layer set travels as a flag (or an
``ACCELERANDO_*`` variable where no flag can say it), so the cluster needs no config file; machine
counts and ranks are not carried: Ray places the processes and the launch ranks them by machine.
"""

from __future__ import annotations

import shlex

from accelerando.launchers.emit.slurm import setting_flags
from accelerando.launchers.emit.spec import JobSpec, check_line, check_word

__all__ = ["render_ray_job"]

# Settings a --ray launch inside the job must not take from the emitting launch: the address is the job's.
_NOT_CARRIED = frozenset({"ray"})


def render_ray_job(spec: JobSpec) -> str:
    """Write the entrypoint script of a Ray job that launches ``spec`` on the cluster it is submitted to.

    Args:
        spec: the job (``num_processes`` processes in all; ``max_restarts`` and the other settings carried).

    Returns:
        The script's text (bash, starting with ``#!/bin/bash``); values are quoted for bash.

    Raises:
        ValueError: the job name holds a control character, or a value a NUL byte or non-UTF-8 text.
    """
    carried = tuple((field, value) for field, value in spec.carried if field.name not in _NOT_CARRIED)
    flags, env = setting_flags(carried)
    name = check_line(spec.name, "--emit ray: the job name", "a comment line",
                      "rename the script without control characters")  # fmt: skip
    command = spec.command
    check_word(command.target, "the script")
    for arg in command.args:
        check_word(arg, "the script argument")
    target = ["-m"] if command.module else ["--no_python"] if command.no_python else []
    launch = ["accelerando", "launch", "--ray", "--num_processes", str(spec.num_processes), *flags]
    lines = [
        "#!/bin/bash",
        f"# Ray job {name}, written by `accelerando launch --emit ray`. Submit it from the folder that holds",
        "# the script (that folder is uploaded to the cluster as the job's working directory):",
        "#   ray job submit --address http://HEAD_NODE:8265 --working-dir . -- bash THIS_FILE",
        f"# {spec.num_processes} process(es), each a Ray actor placed where the cluster has room; a failed",
        f"# process restarts every process up to {spec.max_restarts} time(s) (--max_restarts).",
        "# The cluster's Python environment must have accelerando (with the ray extra) installed.",
        "set -euo pipefail",
        *(f"export {key}={shlex.quote(text)}" for key, text in sorted(env.items())),
        "exec " + shlex.join([*launch, *target, command.target, *command.args]),
        "",
    ]
    return "\n".join(lines)
