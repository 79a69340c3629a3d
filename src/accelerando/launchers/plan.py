"""Launch plans: turn resolved settings and a command into the processes to start.

:func:`build` is pure: given the :class:`~accelerando.core.settings.Settings` the launcher resolved
(defaults < config file < environment < CLI flags), the user's command and a description of the
machine, it returns a :class:`LaunchPlan` (the command line and the environment variables for the
processes) without starting anything, so every rule is tested without spawning. :func:`run` executes
a plan: one process directly, several through PyTorch's elastic agent (``torch.distributed.run``).

The launch plan is the only place that writes environment variables for the processes: every value
some layer set is exported as ``ACCELERANDO_<NAME>`` and under the reference project's name with the
reference's spelling (``ACCELERATE_MIXED_PRECISION``, ``FSDP_*``, ``ACCELERATE_DEEPSPEED_*``,
``ACCELERATE_DYNAMO_*``, ``MEGATRON_LM_*``, ``PARALLELISM_CONFIG_*``, ``ACCELERATE_FP8_*``, ...), so
code written for the reference (transformers among it) reads what it expects. The variables the
reference's launcher always writes (mixed precision and the dynamo options) are written with their
default when nothing set them; :data:`~accelerando.core.settings.resolve.ECHOED_DEFAULTS_ENV` lists those,
so each process still reads them as "not set".

Modes: ``simple`` (one process), ``elastic`` (``torch.distributed.run``), ``deepspeed`` (DeepSpeed's
multi-machine runner) and ``mpirun`` (a multi-CPU job started by ``mpirun --hostfile``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence

from accelerando.backends.strategies import (
    DISTRIBUTED_KINDS,
    DistributedKind,
    distributed_kind,
    requested_backends,
)
from accelerando.core.records import record
from accelerando.core.settings.fields import (
    FIELDS,
    FIELDS_BY_NAME,
    Field,
    fields_in_group,
    machine_range,
    quote_value,
)
from accelerando.core.settings.machine import SOCKET_IFNAME_ENV, MachineInfo, detect_machine, free_port
from accelerando.core.settings.resolve import ECHOED_DEFAULTS_ENV, SOURCES_ENV, Settings
from accelerando.launchers.limits import check_process_count, clip
from accelerando.launchers.mpirun import MpiRun, detect_mpirun, mpirun_argv

TYPE_CHECKING = False  # typing's constant, without importing typing (launcher start-up)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "Command",
    "LaunchPlan",
    "build",
    "check_command",
    "check_files",
    "check_settings",
    "export_env",
    "reference_env",
    "INSTALL_ENV",
    "automatic_layout",
    "machine_counts",
    "loopback_sockets",
    "oversubscription_warning",
    "rendezvous_backend",
    "RANGE_RDZV_BACKEND",
]

_ELASTIC_MODULE = "torch.distributed.run"
#: The rendezvous backend an elastic machine range uses when none is given (torchrun's dynamic one).
RANGE_RDZV_BACKEND = "c10d"
_CHILD_MODULE = "accelerando.launchers._child"
#: The variable that makes every launched process install accelerando as ``accelerate`` first.
INSTALL_ENV = FIELDS_BY_NAME["install_as_accelerate"].our_env
# Settings whose reference variable the reference's launcher writes even when nothing set them, with
# the text it writes then (other settings are written only when set).
_ALWAYS_WRITTEN = {
    "mixed_precision": "no",
    "dynamo_backend": "NO",
    "dynamo_mode": "default",
    "dynamo_use_fullgraph": "False",
    "dynamo_use_dynamic": "False",
    "dynamo_use_regional_compilation": "False",
}


@record
class Command:
    """What to run in each process.

    Attributes:
        target: a script path, a module name (``module=True``) or an executable (``no_python=True``).
        args: arguments passed to it untouched.
        module: run ``target`` as ``python -m target``.
        no_python: run ``target`` directly, without the Python interpreter.
    """

    target: str
    args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False

    def __post_init__(self) -> None:
        if self.module and self.no_python:
            raise ValueError("--module and --no_python cannot be combined. Fix: pass only one of them.")


@record
class LaunchPlan:
    """Everything needed to start the processes of one launch.

    Attributes:
        mode: ``"simple"`` (one process, run directly), ``"elastic"`` (torch.distributed.run),
            ``"deepspeed"`` (DeepSpeed's multi-node runner, which starts the other hosts itself) or
            ``"mpirun"`` (``mpirun`` starts every process of a multi-CPU job).
        argv: the equivalent command line; for ``"elastic"`` it starts with
            ``python -m torch.distributed.run`` and :func:`run` passes the rest to the agent in-process.
        env: variables to add to the processes' environment.
        num_processes: processes on all machines together.
        nproc_per_node: processes started on this machine.
        num_machines: machines in the job.
        machine_rank: rank of this machine.
        notes: sentences to show the user (choices the plan made for them).
        hang_timeout_s: seconds without progress before the launcher stops a multi-process job
            (0: never); see :mod:`accelerando.launchers.watchdog`.
        min_machines: the fewest machines an elastic job (``--num_machines MIN:MAX``) runs with;
            ``None`` for a fixed machine count. ``num_machines`` and ``num_processes`` are then the
            largest job (MAX machines); the agent tells each process the current ``WORLD_SIZE``.
        bind_address: the address the launch's listeners bind (the rendezvous store): ``--bind_address``,
            else ``--main_process_ip``, else loopback (see :func:`accelerando.core.listeners.listen_address`).
    """

    mode: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    num_processes: int
    nproc_per_node: int
    num_machines: int
    machine_rank: int
    notes: tuple[str, ...] = ()
    hang_timeout_s: float = 0.0
    min_machines: int | None = None
    bind_address: str = "127.0.0.1"

    @property
    def elastic_range(self) -> bool:
        """Whether the machine count may change while the job runs (``--num_machines MIN:MAX``)."""
        return self.min_machines is not None and self.min_machines != self.num_machines

    @property
    def uses_backend_runner(self) -> bool:
        """Whether the plan runs a backend's own multi-machine runner (``mode`` is then the backend's name)."""
        return self.mode not in ("simple", "elastic", "mpirun")

    @property
    def agent_args(self) -> list[str]:
        """Arguments for ``torch.distributed.run`` (the argv after ``python -m torch.distributed.run``)."""
        if self.mode != "elastic":
            raise ValueError("agent_args exists only for an elastic plan.")
        return list(self.argv[3:])

    def describe(self) -> str:
        """Return a human-readable summary (what ``--dry-run`` prints)."""
        if self.elastic_range:
            low = self.min_machines or 1
            topology = (
                f"Topology: {low * self.nproc_per_node} to {self.num_processes} process(es) on {low} to "
                f"{self.num_machines} machine(s) (elastic range {low}:{self.num_machines}: starts once {low} "
                f"machine(s) joined, re-forms when machines join or leave)"
            )
        else:
            topology = f"Topology: {self.num_processes} process(es) on {self.num_machines} machine(s)"
        lines = [
            f"{topology}; this machine (rank {self.machine_rank}) starts {self.nproc_per_node} ({self.mode} launch)",
            "Command: " + _shell_join(clip(arg) for arg in self.argv),  # each value bounded (limits.clip)
            "Environment:",
            *(f"  {key}={clip(value)}" for key, value in sorted(self.env.items())),
        ]
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)


def _shell_join(words: Iterable[str]) -> str:
    import shlex  # only --dry_run describes a plan

    return shlex.join(words)


def _where(settings: Settings, name: str) -> str:
    return f"{name} (from {settings.source(name)})"


def check_settings(settings: Settings, machine: MachineInfo) -> None:
    """Reject impossible combinations before anything starts.

    Args:
        settings: the launcher's resolved settings.
        machine: the machine the launch runs on.

    Raises:
        ValueError: the message names the offending settings, where each came from, and the fix.
    """
    s = settings
    kind = distributed_kind(s.distributed_type)
    wants_gpu = s.multi_gpu or (kind is not None and kind.requires_gpu)
    if wants_gpu and s.cpu:
        raise ValueError(
            f"{_where(s, 'multi_gpu' if s.multi_gpu else 'distributed_type')} asks for GPUs but "
            f"{_where(s, 'cpu')} forces the CPU. Fix: keep only one of them."
        )
    if wants_gpu and machine.gpu_count == 0:
        name = "multi_gpu" if s.multi_gpu else "distributed_type"
        raise ValueError(
            f"{_where(s, name)} asks for several GPUs but this machine has none visible. Fix: use "
            "--cpu (use_cpu: true, distributed_type: MULTI_CPU in a config file), or run on a GPU machine."
        )
    backends = requested_backends(s)
    if len(backends) > 1:
        named = " and ".join(_where(s, k.switch) for k in backends if k.switch)
        raise ValueError(
            f"{named} are {'both' if len(backends) == 2 else 'all'} set. Fix: choose one backend."
        )
    low, machines = machine_counts(s)
    if low != machines:
        _check_machine_range(s, low, machines)
    if s.num_processes is not None and s.num_processes % machines:
        if low != machines:
            raise ValueError(
                f"{_where(s, 'num_processes')}={s.num_processes} (the total at the largest size, MAX={machines} "
                f"machines) is not a multiple of MAX. Fix: pass a multiple of {machines} (each machine starts "
                f"num_processes / {machines} processes), e.g. {machines * max(1, s.num_processes // machines)}."
            )
        raise ValueError(
            f"{_where(s, 'num_processes')}={s.num_processes} (the total over all machines) is not a multiple "
            f"of {_where(s, 'num_machines')}={machines}. Fix: use a multiple of num_machines."
        )
    if s.machine_rank is not None and s.machine_rank >= machines:
        raise ValueError(
            f"{_where(s, 'machine_rank')}={s.machine_rank} must be below num_machines={machines}. "
            f"Fix: use a machine_rank from 0 to {machines - 1}."
        )
    if machines > 1 and not s.main_process_ip:
        raise ValueError(
            f"{_where(s, 'num_machines')}={machines} needs the address of machine 0. "
            "Fix: pass --main_process_ip (main_process_ip in a config file)."
        )
    if isinstance(s.zero_stage, int) and s.zero_stage > 3:
        raise ValueError(f"{_where(s, 'zero_stage')}={s.zero_stage} does not exist. Fix: use 0, 1, 2 or 3.")
    _check_deepspeed_paths(s)
    _check_unsupported_places(s)
    _check_parallelism(s)
    if s.mpirun_hostfile:
        _check_mpirun(s, wants_gpu)


def machine_counts(settings: Settings) -> tuple[int, int]:
    """The fewest and the most machines of a launch: ``(n, n)`` for ``--num_machines n``, ``(1, 1)`` unset.

    Args:
        settings: the launcher's resolved settings.

    Returns:
        ``(MIN, MAX)`` of ``--num_machines MIN:MAX``.

    Raises:
        ValueError: ``num_machines`` is not a count, or its range is impossible (MIN < 1, MIN > MAX); the
            message names the numbers, where the value came from and the fix.
    """
    value = settings.num_machines
    try:
        low, high = machine_range(value)
    except ValueError as err:
        raise ValueError(f"{_where(settings, 'num_machines')}: {err}") from None
    where = f"{_where(settings, 'num_machines')}={quote_value(str(value))}"
    if low < 1:
        raise ValueError(
            f"{where}: MIN is {low}, but an elastic job needs at least 1 machine to run. Fix: use MIN >= 1 "
            f"(e.g. --num_machines 1:{max(high, 1)})."
        )
    if low > high:
        raise ValueError(
            f"{where}: MIN {low} is above MAX {high}. Fix: write the smaller count first "
            f"(--num_machines {high}:{low})."
        )
    return low, high


def _check_machine_range(s: Settings, low: int, high: int) -> None:
    """What an elastic machine range cannot be combined with: a runner that starts a fixed set of hosts."""
    where = f"{_where(s, 'num_machines')}={low}:{high}"
    if s.rdzv_backend == "static" and s.source("rdzv_backend") != "default":
        raise ValueError(
            f"{where} lets the machine count change, but {_where(s, 'rdzv_backend')}='static' needs exactly "
            f"{high} machines, each with a fixed --machine_rank. Fix: drop --rdzv_backend static (a range then "
            f"uses the {RANGE_RDZV_BACKEND} rendezvous), pass --rdzv_backend {RANGE_RDZV_BACKEND}, or give a "
            "fixed --num_machines."
        )
    if s.mpirun_hostfile:
        raise ValueError(
            f"{where}: mpirun ({_where(s, 'mpirun_hostfile')}) starts the fixed set of hosts of its hostfile. "
            "Fix: give a fixed --num_machines, or drop --mpirun_hostfile to launch through the elastic agent."
        )
    if _multinode_runner(s, high) is not None:
        launcher = s.deepspeed_multinode_launcher or "pdsh"
        raise ValueError(
            f"{where}: DeepSpeed's {launcher} runner starts the fixed set of hosts of its hostfile. Fix: pass "
            "--deepspeed_multinode_launcher standard (accelerando launch on each machine), or give a fixed "
            "--num_machines."
        )


def _check_unsupported_places(s: Settings) -> None:
    """The reference's SageMaker and TPU-pod variables describe jobs this launcher cannot start."""
    for name, what in (("use_sagemaker", "an Amazon SageMaker job"), ("in_tpu_pod", "a TPU pod")):
        if s[name]:
            raise ValueError(
                f"{_where(s, name)} says this runs in {what}, which accelerando does not support. "
                f"Fix: unset {FIELDS_BY_NAME[name].reference_env} and launch on this machine's CPUs/GPUs."
            )


def parallelism_requested(s: Settings) -> bool:
    """Whether the settings ask for an N-d mesh: ``use_parallelism_config`` or any ``parallelism_config_*``."""
    return bool(s.use_parallelism_config) or any(
        s.source(f.name) != "default" for f in fields_in_group("parallelism")
    )


def _check_parallelism(s: Settings) -> None:
    """As the reference: a parallelism config shards with FSDP2 (or DeepSpeed for sequence parallelism)."""
    if not parallelism_requested(s):
        return
    given = (
        _where(s, "use_parallelism_config")
        if s.use_parallelism_config
        else next(_where(s, f.name) for f in fields_in_group("parallelism") if s.source(f.name) != "default")
    )
    if s.use_fsdp and str(s.fsdp_version or "2") != "2":
        raise ValueError(
            f"{given} needs FSDP2 but {_where(s, 'fsdp_version')}={s.fsdp_version}. Fix: use fsdp_version 2."
        )
    if not (s.use_fsdp or s.use_deepspeed):
        raise ValueError(
            f"{given} lays the processes out on a mesh whose data-parallel axes need a sharding backend. "
            "Fix: add --use_fsdp (with fsdp_version 2), or --use_deepspeed for sequence parallelism."
        )


def _check_mpirun(s: Settings, wants_gpu: bool) -> None:
    """An mpirun launch starts multi-CPU jobs only, without restarts and without another backend's runner."""
    where = _where(s, "mpirun_hostfile")
    if wants_gpu:
        raise ValueError(
            f"{where} starts a multi-CPU job through mpirun, but GPUs are asked for. Fix: drop --multi_gpu "
            "(distributed_type MULTI_GPU) or --mpirun_hostfile."
        )
    if s.max_restarts:
        raise ValueError(
            f"{where}: mpirun cannot restart failed processes but {_where(s, 'max_restarts')}={s.max_restarts}. "
            "Fix: set max_restarts to 0, or drop --mpirun_hostfile to launch with torch.distributed.run."
        )
    if s.rdzv_backend != "static":
        raise ValueError(
            f"{where}: mpirun places every process itself; {_where(s, 'rdzv_backend')}={s.rdzv_backend!r} "
            "has no use there. Fix: drop --rdzv_backend, or drop --mpirun_hostfile."
        )


def check_files(s: Settings) -> None:
    """Check that the files a launch reads exist, just before its processes start.

    Not part of :func:`check_settings`: a plan may be made (``--dry_run``, the reference's
    ``_validate_launch_command``, its ``prepare_*`` helpers) where the files are not, and a
    ``deepspeed_config_file`` left in a config file does not matter when DeepSpeed is not used.

    Args:
        s: the launcher's resolved settings.

    Raises:
        ValueError: the mpirun hostfile, or the DeepSpeed config file of a DeepSpeed launch, is not a
            file; the message names the setting, where it came from and the fix.
    """
    if s.mpirun_hostfile and not os.path.isfile(s.mpirun_hostfile):
        raise ValueError(
            f"{_where(s, 'mpirun_hostfile')}={quote_value(s.mpirun_hostfile)} is not a file. Fix: give the path "
            "of an MPI hostfile (one host per line, e.g. `node0 slots=4`)."
        )
    if s.use_deepspeed and s.deepspeed_config_file and not os.path.isfile(s.deepspeed_config_file):
        raise ValueError(
            f"{_where(s, 'deepspeed_config_file')}={quote_value(s.deepspeed_config_file)} is not a file. "
            "Fix: give the path of an existing DeepSpeed JSON config."
        )


def _check_deepspeed_paths(s: Settings) -> None:
    """DeepSpeed settings that must come together (the files themselves: :func:`check_files`)."""
    for kind in ("optimizer", "param"):
        device, path = f"offload_{kind}_device", f"offload_{kind}_nvme_path"
        if s[device] == "nvme" and not s[path]:
            raise ValueError(f"{_where(s, device)}='nvme' needs a folder. Fix: set {path} (--{path}).")


def check_command(
    command: Command, settings: Settings | None = None, which: Callable[[str], str | None] | None = None
) -> None:
    """Check, before anything starts, that a ``--no_python`` program can be run on this machine.

    A multi-machine DeepSpeed launch is not checked: its runner starts the program on other hosts.

    Args:
        command: what each process runs.
        settings: the launcher's resolved settings (to recognise a launch run on other hosts).
        which: finds an executable like :func:`shutil.which` (a test passes a fake; default: that).

    Raises:
        ValueError: the program is not found on ``PATH`` or is not executable; the message names it
            and the fix.
    """
    if settings is not None and settings.install_as_accelerate and command.no_python:
        raise ValueError(
            f"{_where(settings, 'install_as_accelerate')} installs accelerando as `accelerate` inside Python "
            f"processes, but --no_python runs {quote_value(command.target)} without Python. Fix: drop one of them."
        )
    if not command.no_python:
        return
    if settings is not None and _multinode_runner(settings, machine_counts(settings)[1]) is not None:
        return
    if which is None:
        import shutil  # only a --no_python launch looks a program up

        which = shutil.which
    if which(command.target) is None:
        where = "is not an executable file" if "/" in command.target else "is not found on PATH"
        raise ValueError(
            f"--no_python runs {quote_value(command.target)} directly, but it {where}. Fix: give the path of "
            "an executable program (chmod +x for a script), install it, or drop --no_python to run a "
            "Python script."
        )


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def _reference_text(field: Field, value: Any) -> str:
    """A value as the reference's launcher writes it (``True``/``true``/``1`` as that variable has it)."""
    if isinstance(value, bool):
        return field.ref_bool[0 if value else 1]
    return _env_text(value)


def _exported(settings: Settings) -> dict[str, Any]:
    return {
        name: value
        for name, value in settings.explicitly_set().items()
        if value is not None and FIELDS_BY_NAME[name].export
    }


def reference_env(settings: Settings) -> tuple[dict[str, str], dict[str, str]]:
    """The reference project's variables for a launch, spelled as its launcher spells them.

    Args:
        settings: the launcher's resolved settings.

    Returns:
        ``(env, echoed)``: ``env`` holds the reference's variable of every exported setting some layer
        set (``FSDP_SHARDING_STRATEGY``, ``ACCELERATE_DEEPSPEED_ZERO_STAGE``, ``MEGATRON_LM_TP_DEGREE``,
        ``PARALLELISM_CONFIG_TP_SIZE``, ``ACCELERATE_FP8_BACKEND``, ...), the variables the reference
        always writes (mixed precision, dynamo; with DeepSpeed the accumulation steps and
        ``ACCELERATE_CONFIG_DS_FIELDS``) and ``ACCELERATE_USE_PARALLELISM_CONFIG`` when a parallelism
        size is given; ``echoed`` is the part of ``env`` that only repeats a default.
    """
    env: dict[str, str] = {}
    for name, value in _exported(settings).items():
        field = FIELDS_BY_NAME[name]
        if field.reference_env:
            env[field.reference_env] = _reference_text(field, value)
    always = dict(_ALWAYS_WRITTEN)
    if settings.use_deepspeed:
        always["gradient_accumulation_steps"] = str(FIELDS_BY_NAME["gradient_accumulation_steps"].default)
        deepspeed_fields = fields_in_group("deepspeed")
        from_file = [
            f.config_keys[0].split(".")[-1]
            for f in (*deepspeed_fields, FIELDS_BY_NAME["gradient_accumulation_steps"])
            if settings.source(f.name).startswith("config:") and f.config_keys
        ]
        env["ACCELERATE_CONFIG_DS_FIELDS"] = ",".join(from_file)
    echoed: dict[str, str] = {}
    for name, text in always.items():
        variable = FIELDS_BY_NAME[name].reference_env
        if variable and variable not in env:
            env[variable] = echoed[variable] = text
    if parallelism_requested(settings) and not settings.use_parallelism_config:
        env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    return env, echoed


_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _json_string(text: str) -> str:
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    parts = []
    for char in text:
        code = ord(char)
        if char in _JSON_ESCAPES:
            parts.append(_JSON_ESCAPES[char])
        elif 0x20 <= code <= 0x7E:
            parts.append(char)
        elif code > 0xFFFF:  # a surrogate pair, as JSON spells characters beyond the first plane
            code -= 0x10000
            parts.append(f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}")
        else:
            parts.append(f"\\u{code:04x}")
    return '"' + "".join(parts) + '"'


def _json_object(values: Mapping[str, str]) -> str:
    """``json.dumps(values, sort_keys=True)`` of a flat mapping of text, without importing ``json``
    (whose decoder compiles regular expressions on every launch).
    """
    return "{" + ", ".join(f"{_json_string(k)}: {_json_string(v)}" for k, v in sorted(values.items())) + "}"


def export_env(settings: Settings) -> dict[str, str]:
    """Environment variables that carry the settings to the processes.

    Args:
        settings: the launcher's resolved settings.

    Returns:
        ``ACCELERANDO_<NAME>`` for every exported setting whose source is not the default, with
        ``ACCELERANDO_SOURCES`` (where each came from), plus the reference's variables from
        :func:`reference_env` and ``ACCELERANDO_ECHOED_DEFAULTS`` naming those that only repeat a default.
    """
    exported = _exported(settings)
    env = {FIELDS_BY_NAME[name].our_env: _env_text(value) for name, value in exported.items()}
    if exported:  # lets each process say "from config:/x.yaml", not only "from ACCELERANDO_X"
        env[SOURCES_ENV] = _json_object({name: settings.origin(name) for name in exported})
    if parallelism_requested(settings) and not settings.use_parallelism_config:
        env[FIELDS_BY_NAME["use_parallelism_config"].our_env] = "true"
    reference, echoed = reference_env(settings)
    env.update(reference)
    if echoed:
        env[ECHOED_DEFAULTS_ENV] = _json_object(echoed)
    return env


def _topology(settings: Settings, machine: MachineInfo) -> tuple[int, int, list[str]]:
    """Total processes and machines, with notes for choices made on the user's behalf."""
    notes: list[str] = []
    machines = machine_counts(settings)[1]
    total = settings.num_processes
    if total is None:
        ids = settings.gpu_ids
        gpus = 0 if settings.cpu else (len(ids.split(",")) if ids and ids != "all" else machine.gpu_count)
        if _is_one_process_kind(settings) or gpus <= 1:
            total = machines
        else:
            # As the reference does: with several GPUs and no process count, use every GPU.
            total = gpus * machines
            notes.append(
                f"num_processes not given: using {total} (one per visible GPU). Pass --num_processes to change."
            )
    return total, machines, notes


def _process_env(settings: Settings, machine: MachineInfo, total: int, per_node: int) -> dict[str, str]:
    env = export_env(settings)
    low, high = machine_counts(settings)
    if low != high:
        # The job's size changes while it runs: each process reads it from the agent (WORLD_SIZE), and a
        # count written here would be wrong after machines join or leave.
        for name in FIELDS_BY_NAME["num_processes"].env_names:
            env.pop(name, None)
        env["ACCELERANDO_NUM_MACHINES"] = f"{low}:{high}"
    else:
        env["ACCELERANDO_NUM_PROCESSES"] = str(total)
        env["ACCELERANDO_NUM_MACHINES"] = str(high)
    env["ACCELERANDO_MACHINE_RANK"] = str(settings.machine_rank or 0)
    if settings.num_cpu_threads_per_process is not None:
        env["OMP_NUM_THREADS"] = str(settings.num_cpu_threads_per_process)
    elif per_node > 1 and not machine.omp_threads_set:
        # Share the cores instead of letting every process start one thread per core.
        env["OMP_NUM_THREADS"] = str(max(1, machine.cpu_count // per_node))
    if settings.gpu_ids and settings.gpu_ids != "all" and not settings.cpu:
        env["CUDA_VISIBLE_DEVICES"] = settings.gpu_ids
    return env


def _via_child(command: Command) -> Command:
    """The same target started through :mod:`accelerando.launchers._child` (no run folder, no launcher pid).

    Used where no elastic agent wraps the processes, so that ``--install_as_accelerate`` still runs first.
    """
    kind = "module" if command.module else "script"
    return Command(_CHILD_MODULE, ("-", "0", kind, command.target, *command.args), module=True)


def _target_argv(command: Command, python: str) -> list[str]:
    if command.no_python:
        return [command.target, *command.args]
    if command.module:
        return [python, "-m", command.target, *command.args]
    return [python, command.target, *command.args]


def rendezvous_backend(settings: Settings) -> str:
    """The rendezvous backend of a launch: the one given, or ``c10d`` for a machine range left on the default.

    A static rendezvous needs a fixed machine count, so ``--num_machines MIN:MAX`` without
    ``--rdzv_backend`` uses PyTorch's ``c10d`` backend, hosted by machine 0's agent.
    """
    low, high = machine_counts(settings)
    if low != high and settings.source("rdzv_backend") == "default":
        return RANGE_RDZV_BACKEND
    return str(settings.rdzv_backend)


def _range_rdzv_conf(settings: Settings) -> str | None:
    """``--rdzv_conf`` of a machine range: the user's, plus ``is_host=false`` on a machine other than 0.

    The c10d backend hosts its store on every machine whose address matches the endpoint (all of them
    on one host); a machine other than 0 that hosted it would take the rendezvous down when it leaves.
    """
    conf = settings.rdzv_conf or ""
    keys = {item.split("=", 1)[0].strip() for item in conf.split(",") if item.strip()}
    if (settings.machine_rank or 0) > 0 and "is_host" not in keys:
        conf = ",".join(filter(None, (conf, "is_host=false")))
    return conf or None


def _agent_argv(settings: Settings, command: Command, per_node: int, port: Callable[[], int]) -> list[str]:
    low, machines = machine_counts(settings)
    address = settings.main_process_ip or "127.0.0.1"
    main_port = settings.main_process_port or (port() if machines == 1 else 29500)
    backend = rendezvous_backend(settings)
    argv = [
        "--nnodes",
        f"{low}:{machines}" if low != machines else str(machines),
        "--nproc_per_node",
        str(per_node),
    ]
    if low == machines or backend == "static":  # a dynamic rendezvous of a range ranks the machines itself
        argv += ["--node_rank", str(settings.machine_rank or 0)]
    rdzv_conf = _range_rdzv_conf(settings) if low != machines else settings.rdzv_conf
    if backend == "static":
        argv += ["--master_addr", address, "--master_port", str(main_port)]
    else:
        argv += ["--rdzv_backend", backend, "--rdzv_endpoint", f"{address}:{main_port}"]
        if low != machines:  # every machine derives the same id without talking to the others
            argv += ["--rdzv_id", f"accelerando-{main_port}"]
        if _on_loopback(address, machines):
            # The agent hosts the workers' store at this address (its host name otherwise): loopback.
            argv += ["--local_addr", address]
    if rdzv_conf:
        argv += ["--rdzv_conf", rdzv_conf]
    argv += [
        "--max_restarts",
        str(settings.max_restarts),
        "--monitor_interval",
        f"{settings.monitor_interval:g}",
    ]
    if command.module:
        argv.append("--module")
    elif command.no_python:
        argv.append("--no_python")
    return [*argv, command.target, *command.args]


def _inert_notes(settings: Settings) -> list[str]:
    """Notes for option families given without the switch that makes them count (never a silent no-op)."""
    notes = []
    for group, needs, switch in (
        ("fp8", "mixed_precision fp8", settings.mixed_precision == "fp8"),
        ("megatron", "--use_megatron_lm", settings.use_megatron_lm),
    ):
        given = [f.name for f in FIELDS if f.group == group and settings.source(f.name) != "default"]
        if given and not switch:
            notes.append(f"{', '.join(given)}: used only with {needs}, so unused by this launch")
    return notes


def automatic_layout(settings: Settings, machine: MachineInfo, num_processes: int, num_machines: int) -> Any:
    """The :class:`~accelerando.core.parallelism_layout.Layout` of ``--parallelism auto`` (None without a model).

    The model's facts come from ``parallelism_model`` (a transformers ``config.json``), the machine from
    the process count, the machine count and ``parallelism_device_memory`` (default: the first GPU's
    memory, or the RAM shared by this machine's processes).

    Raises:
        ValueError: no layout fits (the numbers and fixes in the message), or a bad model path or size.
    """
    if settings.parallelism != "auto" or not settings.parallelism_model:
        return None
    from accelerando.core import parallelism_layout as pl

    per_node = max(num_processes // num_machines, 1)
    on_gpu = not settings.cpu and machine.gpu_count > 0
    if settings.parallelism_device_memory:
        memory = pl.parse_memory(settings.parallelism_device_memory)
    else:
        memory = _detected_device_memory(on_gpu, per_node)
    shape = pl.MachineShape(num_machines, per_node, memory, "cuda" if on_gpu else "cpu")
    options = {
        "batch_size": settings.parallelism_batch_size or 1,
        "seq_length": settings.parallelism_seq_length or 2048,
        "mixed_precision": settings.mixed_precision or "no",
    }
    simulator = None
    if settings.parallelism_simulate:
        from accelerando.backends.planning.auto import layout_simulator

        simulator = layout_simulator(settings.parallelism_model, **options)
    return pl.choose_layout(
        pl.model_facts_from_config(settings.parallelism_model), shape, simulator=simulator, **options
    )


def _detected_device_memory(on_gpu: bool, per_node: int) -> int:
    if on_gpu:
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // per_node


def _auto_layout(
    settings: Settings, machine: MachineInfo, total: int, machines: int, env: dict[str, str]
) -> list[str]:
    """Notes (and sizes in ``env``) for ``--parallelism auto``; raises ValueError when nothing fits."""
    where = _where(settings, "parallelism")
    sizes = ("DP_REPLICATE", "DP_SHARD", "TP")
    layout = automatic_layout(settings, machine, total, machines)
    if layout is None:
        env.update({f"PARALLELISM_CONFIG_{axis}_SIZE": "auto" for axis in sizes})
        return [
            f"{where}: no --parallelism_model given, so tp / dp_shard / dp_replicate are left 'auto' for the "
            "script: ParallelismConfig().resolve_auto(model, num_processes=...) chooses and logs them"
        ]
    notes = [f"automatic layout ({where}): {layout.describe()}", *(f"  {line}" for line in layout.reason)]
    if layout.pp > 1:
        env.update({f"PARALLELISM_CONFIG_{axis}_SIZE": "auto" for axis in sizes})
        notes.append(
            f"  pp={layout.pp}: ParallelismConfig has no pipeline axis; the script must split the model with "
            f"PipelineParallelPlugin(pp_size={layout.pp}) (resolve_auto refuses this layout)"
        )
        return notes
    if layout.tp > 1 or layout.dp_shard > 1:
        if not settings.use_fsdp:
            raise ValueError(
                f"the automatic layout {layout.describe()} shards the model, which needs FSDP2. "
                "Fix: add --use_fsdp --fsdp_version 2, or give more memory per device. Why: "
                + "; ".join(layout.reason[-2:])
            )
        env.update(
            {
                "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": str(layout.dp_replicate),
                "PARALLELISM_CONFIG_DP_SHARD_SIZE": str(layout.dp_shard),
                "PARALLELISM_CONFIG_TP_SIZE": str(layout.tp),
                "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
                FIELDS_BY_NAME["use_parallelism_config"].our_env: "true",
            }
        )
    return notes


def _is_one_process_kind(settings: Settings) -> bool:
    """Whether the settings ask for a one-process kind (``distributed_type: NO``)."""
    kind = distributed_kind(settings.distributed_type)
    return kind is not None and kind.one_process


def _multinode_runner(settings: Settings, machines: int) -> DistributedKind | None:
    """The requested backend whose own runner starts every machine, when it is to be used.

    Only on several machines, and not with the "standard" multi-node launcher (torchrun on each
    machine, which the elastic plan does).
    """
    launcher = settings.deepspeed_multinode_launcher or "pdsh"
    if machines <= 1 or launcher == "standard":
        return None
    return next((k for k in requested_backends(settings) if k.multinode_runner is not None), None)


def _runner_argv(
    settings: Settings, command: Command, runner: DistributedKind, machines: int, per_node: int, python: str
) -> list[str]:
    """``python -m <runner> ...`` (DeepSpeed's runner and its options): the main machine starts every host."""
    argv = [
        python,
        "-m",
        str(runner.multinode_runner),
        "--no_local_rank",
        "--num_nodes",
        str(machines),
        "--num_gpus",
        str(per_node),
        "--master_addr",
        settings.main_process_ip or "127.0.0.1",
        "--master_port",
        str(settings.main_process_port or 29500),
        "--launcher",
        settings.deepspeed_multinode_launcher or "pdsh",
    ]
    if settings.deepspeed_hostfile:
        argv += ["--hostfile", settings.deepspeed_hostfile]
    if settings.deepspeed_inclusion_filter:
        argv += ["--include", settings.deepspeed_inclusion_filter]
    if settings.deepspeed_exclusion_filter:
        argv += ["--exclude", settings.deepspeed_exclusion_filter]
    if command.module:
        argv.append("--module")
    elif command.no_python:
        argv.append("--no_python")
    return [*argv, command.target, *command.args]


def _auto_setting_notes(settings: Settings) -> list[str]:
    """One note per backend setting left at "auto": it is decided at prepare(), not by the launcher."""
    return [
        f"{what}: auto ({settings.source(name)}): chosen at prepare() from the model's size and each "
        "device's memory; the choice and its reason are logged then"
        for name, what in (item for kind in DISTRIBUTED_KINDS for item in kind.auto_settings)
        if settings[name] in ("auto", "AUTO")
    ]


def _mpirun_launch(
    settings: Settings,
    env: dict[str, str],
    notes: list[str],
    mpirun: Callable[[], MpiRun],
    port: Callable[[], int],
    shape: tuple[int, int, int],
) -> list[str]:
    """The ``mpirun`` part of an ``mpirun_hostfile`` launch's command line.

    Sets the rendezvous (and oneCCL worker count) in ``env``, which mpirun forwards to every process,
    and adds a note naming the mpirun found. ``shape`` is (processes, processes per machine, machines).

    Raises:
        ValueError: ``mpirun`` is missing or unknown.
    """
    total, per_node, machines = shape
    found = mpirun()
    main_port = settings.main_process_port or (port() if machines == 1 else 29500)
    env["MASTER_ADDR"] = settings.main_process_ip or "127.0.0.1"
    env["MASTER_PORT"] = str(main_port)
    if settings.mpirun_ccl is not None:
        env["CCL_WORKER_COUNT"] = str(settings.mpirun_ccl)
    notes.append(
        f"multi-CPU job started by {found.flavour} mpirun on the hosts of {settings.mpirun_hostfile}"
    )
    return mpirun_argv(found, settings.mpirun_hostfile, total, per_node, forward=env)


def build(
    settings: Settings,
    command: Command,
    machine: MachineInfo | None = None,
    *,
    agent_options: Sequence[str] = (),
    port: Callable[[], int] = free_port,
    mpirun: Callable[[], MpiRun] = detect_mpirun,
) -> LaunchPlan:
    """Plan a launch without starting anything.

    Args:
        settings: the launcher's resolved settings (see :func:`accelerando.core.settings.resolve`).
        command: what each process runs.
        machine: the machine the launch runs on; ``None`` detects this one
            (:func:`accelerando.core.settings.machine.detect_machine`).
        agent_options: extra ``torch.distributed.run`` options (``--role``, ``--tee``, ``--log_dir``).
        port: returns a free port for a single-machine job that did not choose one.
        mpirun: finds ``mpirun`` for an ``mpirun_hostfile`` launch (see
            :func:`accelerando.launchers.mpirun.detect_mpirun`).

    Returns:
        The :class:`LaunchPlan`: ``mpirun`` when a hostfile for it is given; one process run directly;
        or an elastic-agent launch when more than one process, more than one machine or restarts are
        asked for. With ``install_as_accelerate`` every process starts through
        :mod:`accelerando.launchers._child`, which installs accelerando as ``accelerate`` first.

    Raises:
        ValueError: for an impossible combination of settings (see :func:`check_settings`), or an
            ``mpirun`` that is missing or unknown.
    """
    if machine is None:
        machine = detect_machine()
    check_settings(settings, machine)
    total, machines, notes = _topology(settings, machine)
    low = machine_counts(settings)[0]
    per_node = total // machines
    check_process_count(per_node, f"{_where(settings, 'num_processes')}={total}")
    if low != machines:
        notes.append(_range_note(settings, low, machines))
    env = _process_env(settings, machine, total, per_node)
    if _is_one_process_kind(settings) and total > 1:
        # A config written for one process must not pin several processes to "not distributed".
        env.pop(FIELDS_BY_NAME["distributed_type"].our_env, None)
        notes.append(
            f"distributed_type 'NO' ({settings.source('distributed_type')}) ignored: {total} processes."
        )
    notes += _auto_setting_notes(settings) + _inert_notes(settings)
    if settings.parallelism == "auto":
        notes += _auto_layout(settings, machine, total, machines, env)
    elastic = total > 1 or machines > 1 or settings.max_restarts > 0 or low != machines
    mode = "elastic" if elastic else "simple"
    runner = _multinode_runner(settings, machines)
    # The elastic agent's processes start through the shim anyway (see runner.py); the others only for this.
    target = _via_child(command) if settings.install_as_accelerate else command
    if settings.mpirun_hostfile:
        if runner is not None:
            raise ValueError(
                f"{_where(settings, 'mpirun_hostfile')} and DeepSpeed's multi-machine runner "
                f"({_where(settings, 'deepspeed_multinode_launcher')}) both start the hosts. Fix: choose one."
            )
        mode = "mpirun"
        argv = _mpirun_launch(settings, env, notes, mpirun, port, (total, per_node, machines))
        argv += _target_argv(target, machine.python)
    elif runner is not None:
        mode = runner.strategy  # the runner's plan is named after its backend ("deepspeed")
        argv = _runner_argv(settings, target, runner, machines, per_node, machine.python)
        notes.append(
            f"multi-machine DeepSpeed job: started from this machine by DeepSpeed's "
            f"{settings.deepspeed_multinode_launcher or 'pdsh'} launcher on every host of the hostfile"
        )
    elif elastic:
        agent = _agent_argv(settings, command, per_node, port)
        argv = [machine.python, "-m", _ELASTIC_MODULE, *agent_options, *agent]
    else:
        argv = _target_argv(target, machine.python)
    # What accelerando.core.listeners.listen_address says (not imported here: the one-process launch's start-up).
    bind = (settings.bind_address or settings.main_process_ip or "127.0.0.1").strip()
    if mode == "elastic":  # the processes start on this machine (mpirun and DeepSpeed's runner: on the hosts)
        notes += oversubscription_warning(settings, machine, per_node, machines)
        if _on_loopback(bind, machines):
            env.update(loopback_sockets(machine))
    if settings.install_as_accelerate:
        env[INSTALL_ENV] = "true"
    return LaunchPlan(
        mode=mode,
        argv=tuple(argv),
        env=env,
        num_processes=total,
        nproc_per_node=per_node,
        num_machines=machines,
        machine_rank=settings.machine_rank or 0,
        notes=tuple(notes),
        hang_timeout_s=float(settings.hang_timeout or 0),
        min_machines=low if low != machines else None,
        bind_address=bind,
    )


def _on_loopback(address: str, machines: int) -> bool:
    """Whether a launch on ``machines`` machines binding ``address`` is this machine's alone.

    :func:`accelerando.core.listeners.is_loopback`'s rule for the spellings a launch gets (127.x.y.z,
    ``::1``, ``localhost``), without importing ``ipaddress`` on the launcher's start-up path.
    """
    host = address.strip().strip("[]").lower()
    return machines == 1 and (host.startswith("127.") or host in ("::1", "localhost"))


def loopback_sockets(machine: MachineInfo) -> dict[str, str]:
    """Variables that bind gloo's and NCCL's sockets to the loopback interface (a one-machine job).

    gloo listens on the address this machine's host name resolves to, and NCCL on its first
    non-loopback interface: reachable from other machines, although every peer is on this one. A
    variable the user set is left alone.

    Args:
        machine: the machine the processes start on.

    Returns:
        ``{"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}`` less those the user set; empty
        when the loopback interface's name is unknown.
    """
    if machine.loopback_interface is None:
        return {}
    return {
        name: machine.loopback_interface
        for name in SOCKET_IFNAME_ENV
        if name not in machine.interfaces_chosen
    }


def oversubscription_warning(
    settings: Settings, machine: MachineInfo, per_node: int, machines: int = 1
) -> list[str]:
    """A warning when more CPU processes start on this machine than it has CPU cores to run them.

    Each process then shares a core with others (oversubscription): the job runs slower than with
    fewer processes, and collectives wait on the slowest. Counted with the cores this process may run
    on (``os.sched_getaffinity`` where available, see :func:`~accelerando.core.settings.machine.detect_machine`).

    Args:
        settings: the launcher's resolved settings.
        machine: the machine the processes start on.
        per_node: processes started on this machine.
        machines: machines in the job (the suggested ``--num_processes`` counts all of them).

    Returns:
        One ``warning: ...`` line naming both numbers and the fix, or nothing (GPU processes, or
        enough cores).
    """
    on_cpu = settings.cpu or machine.gpu_count == 0
    if not on_cpu:
        return []
    cores = max(machine.cpu_count, 1)
    if per_node <= cores:
        return []
    fewer = cores * machines
    return [
        f"warning: {per_node} CPU processes on the {cores} CPU core(s) this machine lets them use: they "
        f"oversubscribe the cores, so the job runs slower than with {cores}. Fix: pass --num_processes "
        f"{fewer} (or fewer), each with OMP_NUM_THREADS=1 (the launcher's default when it is not set)"
    ]


def _range_note(settings: Settings, low: int, high: int) -> str:
    """What an elastic machine range does, said once at launch."""
    backend = rendezvous_backend(settings)
    chosen = " (rdzv_backend not given)" if settings.source("rdzv_backend") == "default" else ""
    restarts = settings.max_restarts or 0
    leaving = (
        f"the others restart without it (up to {restarts} time(s), --max_restarts)"
        if restarts
        else "the job ends (pass --max_restarts N to let the others go on)"
    )
    return (
        f"elastic range {low}:{high} machines through the {backend} rendezvous{chosen}: training starts once "
        f"{low} machine(s) joined (after the rendezvous' last call) and re-forms when a machine joins; when "
        f"one leaves, {leaving}"
    )
