"""An sbatch script for a :class:`~accelerando.launchers.emit.JobSpec`.

The script asks for ``num_machines`` nodes with one task each and runs, through ``srun``, one
``accelerando launch`` per node, which starts that node's processes. The rendezvous comes from the
allocation when the job runs: the first host of ``SLURM_JOB_NODELIST`` hosts it, each node's rank is
``SLURM_NODEID`` and the machine count is ``SLURM_NNODES`` (so ``sbatch --nodes=K job.sh`` resizes
the job without editing it). With ``--num_machines MIN:MAX`` it asks for ``--nodes=MIN-MAX``, each
node launches with ``--num_machines MIN:$SLURM_NNODES`` on the c10d rendezvous, and a node that fails
does not end the step: the others go on without it while MIN remain. The job is requeueable: SLURM
signals the batch shell with ``USR1`` ahead of the time limit (``--signal``), the script then
requeues the job, and SLURM stops the running step with ``SIGTERM`` so the processes can write a
checkpoint before they end.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from accelerando.core.settings.fields import Field
from accelerando.launchers.emit.spec import JobSpec, check_line, check_word, value_text

__all__ = ["REQUEUE_SIGNAL", "SIGNAL_LEAD_SECONDS", "directive_value", "render_sbatch", "setting_flags"]

#: The signal SLURM sends the batch shell before the time limit, and how many seconds before.
REQUEUE_SIGNAL = "USR1"
SIGNAL_LEAD_SECONDS = 90
# A port every task of a job agrees on without talking, different for jobs that share a node.
_PORT_FROM_JOB_ID = "$((15000 + SLURM_JOB_ID % 20000))"
# What sbatch reads as is in a directive's value; anything else is written quoted.
_PLAIN_DIRECTIVE = re.compile(r"[A-Za-z0-9_./:@%+=,-]+")


def directive_value(text: str) -> str:
    r"""Spell ``text`` so that sbatch reads it back whole from an ``#SBATCH --option=VALUE`` line.

    sbatch splits a directive at blanks outside quotes, ends it at an unescaped ``#`` (older
    versions: even inside quotes) and takes ``\`` as an escape, in or out of quotes; so the value is
    put in double quotes with ``\``, ``"``, ``'`` and ``#`` escaped. The caller refuses control
    characters first (:func:`~accelerando.launchers.emit.spec.check_line`): a line cannot carry them.

    Args:
        text: the value, without control characters.

    Returns:
        ``text`` itself when it has only letters, digits and ``_./:@%+=,-``, else its quoted spelling.
    """
    if _PLAIN_DIRECTIVE.fullmatch(text):
        return text
    return '"' + re.sub(r"([\\\"'#])", r"\\\1", text) + '"'


def setting_flags(carried: tuple[tuple[Field, object], ...]) -> tuple[list[str], dict[str, str]]:
    """Spell carried settings as launcher flags, or as ``ACCELERANDO_*`` variables when no flag can.

    Args:
        carried: ``(field, value)`` pairs from :attr:`JobSpec.carried`.

    Returns:
        ``(flags, env)``: a switch set to true is its flag alone; a switch set to false, or a setting
        without a flag, becomes a variable.

    Raises:
        ValueError: a value holds a NUL byte or is not UTF-8 (no command line can carry it).
    """
    flags: list[str] = []
    env: dict[str, str] = {}
    for field, value in carried:
        check_word(value_text(value), f"the value of {field.name}")
        if field.cli is None or (field.switch and value is not True):
            env[field.our_env] = value_text(value)
        elif field.switch:
            flags.append(field.cli)
        else:
            flags += [field.cli, value_text(value)]
    return flags, env


def _launch_line(spec: JobSpec, flags: list[str]) -> str:
    """The command each task runs; ``$VAR`` parts are read in the task (SLURM_NODEID differs per node).

    Every value from the user goes through :func:`shlex.quote` twice: once for the task's ``bash -c``,
    once (the whole line) for the batch script, so that it arrives byte for byte, newlines included.
    """
    machines = f"{spec.min_machines}:$SLURM_NNODES" if spec.machine_range else "$SLURM_NNODES"
    given = any(field.name == "rdzv_backend" for field, _value in spec.carried)  # then among the flags
    rendezvous = (
        f"--rdzv_backend {shlex.quote(spec.rdzv_backend)} " if spec.machine_range and not given else ""
    )
    per_task = (
        f'exec accelerando launch --num_machines "{machines}" {rendezvous}--machine_rank "$SLURM_NODEID" '
        '--main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT" '
        f'--num_processes "$((SLURM_NNODES * {spec.nproc_per_node}))"'
    )
    command = spec.command
    target = ["-m"] if command.module else ["--no_python"] if command.no_python else []
    check_word(command.target, "the script")
    for arg in command.args:
        check_word(arg, "the script argument")
    rest = shlex.join([*flags, *target, command.target, *command.args])
    return shlex.quote(f"{per_task} {rest}")


def render_sbatch(spec: JobSpec, workdir: str | None = None) -> str:
    """Write the sbatch script of ``spec``.

    Args:
        spec: the job.
        workdir: the folder the job runs in (``#SBATCH --chdir``); default: the current folder, where
            a relative script path given to ``accelerando launch`` is found.

    Returns:
        The script's text (bash, starting with ``#!/bin/bash``). Values from the user or the
        environment are quoted for sbatch (directives) or bash (the commands).

    Raises:
        ValueError: the folder or the job name holds a control character (an ``#SBATCH`` line cannot
            carry one: a newline would start a line bash runs), or a value holds a NUL byte.
    """
    flags, env = setting_flags(spec.carried)
    folder = check_line(
        workdir or str(Path.cwd()), "--emit slurm: the working directory", "an #SBATCH --chdir line",
        "emit the job from a folder whose path has no control characters (rename the folder, or move the "
        "job's files to one)",
    )  # fmt: skip
    name = check_line(spec.name, "--emit slurm: the job name", "an #SBATCH --job-name line",
                      "rename the script without control characters")  # fmt: skip
    sbatch = [
        f"--job-name={directive_value(name)}",
        f"--nodes={spec.min_machines}-{spec.num_machines}"
        if spec.machine_range
        else f"--nodes={spec.num_machines}",
        "--ntasks-per-node=1",
    ]
    if spec.gpus_per_node:
        sbatch.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.cpus_per_node:
        sbatch.append(f"--cpus-per-task={spec.cpus_per_node}")
    sbatch += [
        "--requeue",
        f"--signal=B:{REQUEUE_SIGNAL}@{SIGNAL_LEAD_SECONDS}",
        "--open-mode=append",
        f"--chdir={directive_value(folder)}",
    ]
    port = str(spec.main_port) if spec.main_port else _PORT_FROM_JOB_ID
    # In a range, the step goes on without a node that failed (the others re-form the job without it).
    bad_exit = "--kill-on-bad-exit=0" if spec.machine_range else "--kill-on-bad-exit=1"
    srun = ["srun", "--nodes=$SLURM_NNODES", "--ntasks-per-node=1", bad_exit]
    if spec.cpus_per_node:
        srun.append(f"--cpus-per-task={spec.cpus_per_node}")  # srun does not inherit sbatch's value
    lines = [
        "#!/bin/bash",
        "# SLURM job written by `accelerando launch --emit slurm`. Submit it with `sbatch FILE`; sbatch",
        "# options given on that command line (--time, --partition, --nodes, ...) override the lines below.",
        f"# {spec.machines_text.replace(':', ' to ')} machine(s) x {spec.nproc_per_node} process(es): one "
        "`accelerando launch` per",
        "# machine starts that machine's processes.",
        *(f"#SBATCH {option}" for option in sbatch),
        "",
        "# The environment that has accelerando must be active here (e.g. `source .venv/bin/activate`).",
        "set -uo pipefail",
        "",
        "# Rendezvous: the first machine of the allocation hosts it; every machine uses the same port.",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT=${{MASTER_PORT:-{port}}}",
        "export MASTER_ADDR MASTER_PORT",
        *(f"export {name}={shlex.quote(text)}" for name, text in sorted(env.items())),
        "",
        f"# Preemption and time limit: SLURM sends {REQUEUE_SIGNAL} to this script {SIGNAL_LEAD_SECONDS} s before",
        "# the end. The job is requeued; SLURM then stops the running step with SIGTERM (the processes",
        "# write their checkpoint) and starts the job again later, which resumes from it.",
        "requeue_job() {",
        f'    echo "accelerando job $SLURM_JOB_ID: {REQUEUE_SIGNAL} received, requeueing" >&2',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "}",
        f"trap requeue_job {REQUEUE_SIGNAL}",
        "",
        f"{' '.join(srun)} bash -c {_launch_line(spec, flags)} &",
        "step=$!",
        "# A trapped signal ends `wait` early; keep waiting until the step itself has ended.",
        "while true; do",
        '    wait "$step"',
        "    status=$?",
        '    kill -0 "$step" 2>/dev/null || break',
        "done",
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)
