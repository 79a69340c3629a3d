"""What every job format shares: :class:`JobSpec`, computed from a launch's settings by :func:`job_spec`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from accelerando.backends.strategies import distributed_kind
from accelerando.core.settings.fields import FIELDS_BY_NAME, Field
from accelerando.core.settings.machine import MachineInfo
from accelerando.core.settings.resolve import Settings
from accelerando.launchers.plan import Command, check_settings, machine_counts, rendezvous_backend

__all__ = ["JobSpec", "TOPOLOGY_SETTINGS", "check_line", "check_word", "job_spec", "value_text"]

#: Settings a job sets per machine from the scheduler (or that only steer the writing): not carried.
TOPOLOGY_SETTINGS = frozenset(
    {
        "num_processes",
        "num_machines",
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "emit",
        "emit_to",
        "emit_image",
    }
)


@dataclass(frozen=True)
class JobSpec:
    """What a job file needs, whatever its format.

    Attributes:
        name: the job's name (from the script's name; lowercase letters, digits and dashes).
        num_machines: machines (nodes, pods) in the job.
        nproc_per_node: processes each machine starts.
        gpus_per_node: GPUs each machine needs (0: a CPU job, ``--cpu``).
        cpus_per_node: CPU cores each machine needs, or ``None`` when no setting says.
        main_port: the rendezvous port the settings fix, or ``None`` (the format picks one).
        max_restarts: restarts of the processes allowed before the job fails.
        rdzv_backend: the rendezvous backend (``static``, ``c10d``, ``etcd``, ...).
        command: what each process runs.
        carried: ``(field, value)`` for every other setting some layer set, in table order.
        min_machines: the fewest machines of an elastic range (``--num_machines MIN:MAX``; ``num_machines``
            is then MAX), or ``None`` for a fixed count.
    """

    name: str
    num_machines: int
    nproc_per_node: int
    gpus_per_node: int
    cpus_per_node: int | None
    main_port: int | None
    max_restarts: int
    rdzv_backend: str
    command: Command
    carried: tuple[tuple[Field, object], ...] = field(default_factory=tuple)
    min_machines: int | None = None

    @property
    def num_processes(self) -> int:
        """Processes in the whole job (at its largest, for an elastic range)."""
        return self.num_machines * self.nproc_per_node

    @property
    def machine_range(self) -> bool:
        """Whether the job runs with ``min_machines`` to ``num_machines`` machines."""
        return self.min_machines is not None and self.min_machines != self.num_machines

    @property
    def machines_text(self) -> str:
        """``MIN:MAX`` for an elastic range, else the machine count (as ``--num_machines`` takes it)."""
        return f"{self.min_machines}:{self.num_machines}" if self.machine_range else str(self.num_machines)

    @property
    def elastic(self) -> bool:
        """Whether the job restarts failed processes, uses a dynamic rendezvous or a machine range."""
        return self.max_restarts > 0 or self.rdzv_backend != "static" or self.machine_range


def value_text(value: object) -> str:
    """A resolved setting value spelled as a flag value or an environment variable reads it back.

    Args:
        value: a value from :class:`~accelerando.core.settings.Settings`.

    Returns:
        ``true``/``false`` for booleans, a comma-joined list for tuples, else ``str(value)``.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


# C0 controls and DEL: a line-based format (an #SBATCH directive, a name) cannot carry them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _control_name(char: str) -> str:
    names = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte"}
    return names.get(char, f"the control character {char!r}")


def check_word(value: str, what: str) -> str:
    """Refuse a value that no process can receive: a NUL byte (argv and environ end strings there) or text
    that is not UTF-8 (a name from undecodable bytes, which the job file cannot be written with).

    Args:
        value: a script argument, a setting's value, a path.
        what: how the user knows the value (``"the script argument 'x'"``), for the message.

    Returns:
        ``value`` unchanged.

    Raises:
        ValueError: one line naming the value and the fix.
    """
    if "\x00" in value:
        raise ValueError(
            f"{what} {value!r} contains a NUL byte, which no command line or environment variable can carry. "
            "Fix: remove it."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} {value!r} is not UTF-8 text (it came from undecodable bytes), which a job file cannot hold. "
            "Fix: rename it with UTF-8 characters."
        ) from None
    return value


def check_line(value: str, what: str, carrier: str, fix: str) -> str:
    """Refuse a value with a control character (newline, CR, NUL, any other C0, DEL) where ``carrier`` is a
    one-line field that cannot hold one; a newline there would start a line of its own in the job file.

    Args:
        value: the value to write.
        what: how the user knows the value (``"the working directory"``), for the message.
        carrier: where it goes (``"an #SBATCH line"``).
        fix: what the user can do, as a sentence without its final period.

    Returns:
        ``value`` unchanged.

    Raises:
        ValueError: one line naming the value, the character and the fix.
    """
    check_word(value, what)
    found = _CONTROL.search(value)
    if found is not None:
        raise ValueError(
            f"{what} {value!r} contains {_control_name(found.group())}, which {carrier} cannot carry. Fix: {fix}."
        )
    return value


def _job_name(command: Command) -> str:
    stem = Path(command.target).stem if not command.module else command.target.rsplit(".", 1)[-1]
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")
    return (name or "accelerando-job")[:40].rstrip("-")


def _wants_gpus(settings: Settings) -> bool:
    kind = distributed_kind(settings.distributed_type)
    return not (settings.cpu or (kind is not None and kind.forces_cpu))


def _carried(settings: Settings) -> tuple[tuple[Field, object], ...]:
    """Settings some layer set that a job carries: those a flag or a config file can give."""
    carried = []
    for name, value in settings.explicitly_set().items():
        f = FIELDS_BY_NAME[name]
        if name in TOPOLOGY_SETTINGS or value is None or not (f.cli or f.config_keys):
            continue
        carried.append((f, value))
    return tuple(carried)


def job_spec(settings: Settings, command: Command) -> JobSpec:
    """Compute the job a launch with ``settings`` describes.

    Each machine of the job runs ``num_processes / num_machines`` processes, with that many GPUs
    unless ``--cpu`` (or a CPU distributed type) is set; ``num_cpu_threads_per_process`` sizes the
    CPU request.

    Args:
        settings: the launcher's resolved settings (``emit`` among them).
        command: what each process runs.

    Returns:
        The :class:`JobSpec`.

    Raises:
        ValueError: impossible settings (as a launch would refuse them), or a GPU job without
            ``--num_processes`` (this machine's GPUs say nothing about the cluster's).
    """
    low, machines = machine_counts(settings)
    gpus = _wants_gpus(settings)
    total = settings.num_processes
    if total is None:
        ids = settings.gpu_ids
        if gpus and ids and ids != "all":
            total = len(ids.split(",")) * machines
        elif gpus and settings.multi_gpu:
            raise ValueError(
                "--emit with --multi_gpu needs the number of processes: the GPUs of this machine say nothing "
                "about the cluster's. Fix: pass --num_processes (all machines together, e.g. 8 GPUs x 2 "
                "machines = 16)."
            )
        else:
            total = machines
    per_node = max(1, total // machines)
    # Checked as a launch on one machine of the cluster would be: it has the GPUs the job asks for, and
    # the scheduler gives it machine 0's address.
    as_run = type(settings)(  # a copy, whether Settings is a dataclass or a record
        values={**settings.values, "main_process_ip": "scheduler", "machine_rank": 0},
        sources={**settings.sources, "main_process_ip": "scheduler", "machine_rank": "scheduler"},
        origins=settings.origins,
    )
    check_settings(as_run, MachineInfo(gpu_count=per_node if gpus else 0, cpu_count=per_node))
    threads = settings.num_cpu_threads_per_process
    return JobSpec(
        name=_job_name(command),
        num_machines=machines,
        nproc_per_node=per_node,
        gpus_per_node=per_node if gpus else 0,
        cpus_per_node=threads * per_node if threads else None,
        main_port=settings.main_process_port or None,
        max_restarts=int(settings.max_restarts or 0),
        rdzv_backend=rendezvous_backend(settings),
        command=command,
        carried=_carried(settings),
        min_machines=low if low != machines else None,
    )
