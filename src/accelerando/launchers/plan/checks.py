"""The launch plan's refusals: impossible combinations of settings, missing files and programs.

Each check raises one ``ValueError`` naming the settings involved, where each came from and the fix,
before anything starts.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from accelerando.backends.strategies import DistributedKind, distributed_kind, requested_backends
from accelerando.core.settings.fields import FIELDS_BY_NAME, fields_in_group, machine_range, quote_value
from accelerando.core.settings.machine import MachineInfo
from accelerando.core.settings.resolve import Settings
from accelerando.launchers.plan.spec import Command

__all__ = [
    "RANGE_RDZV_BACKEND",
    "check_command",
    "check_files",
    "check_settings",
    "machine_counts",
    "parallelism_requested",
    "rdzv_conf_keys",
]

#: The rendezvous backend an elastic machine range uses when none is given (torchrun's dynamic one).
RANGE_RDZV_BACKEND = "c10d"


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
    _check_rendezvous_timeouts(s)
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


def rdzv_conf_keys(conf: str | None) -> set[str]:
    """The keys of a ``key1=value1,key2=value2`` rendezvous configuration (``rdzv_conf``)."""
    return {item.split("=", 1)[0].strip() for item in (conf or "").split(",") if item.strip()}


# The settings that write a dynamic rendezvous' --rdzv_conf keys, and those keys.
_TIMEOUT_KEYS = {
    "rdzv_last_call_timeout": ("last_call_timeout",),
    "rdzv_peer_timeout": ("keep_alive_interval", "keep_alive_max_attempt"),
}


def _check_rendezvous_timeouts(s: Settings) -> None:
    """A timeout set both as its own setting and as a key of ``rdzv_conf`` is ambiguous."""
    keys = rdzv_conf_keys(s.rdzv_conf)
    for name, named in _TIMEOUT_KEYS.items():
        both = [key for key in named if key in keys]
        if both and s.source(name) != "default":
            raise ValueError(
                f"{_where(s, name)}={s[name]} and {_where(s, 'rdzv_conf')} key {both[0]} both set the same "
                f"rendezvous timeout. Fix: keep one of them (drop {both[0]} from rdzv_conf, or --{name})."
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
    if (which or shutil.which)(command.target) is None:
        where = "is not an executable file" if "/" in command.target else "is not found on PATH"
        raise ValueError(
            f"--no_python runs {quote_value(command.target)} directly, but it {where}. Fix: give the path of "
            "an executable program (chmod +x for a script), install it, or drop --no_python to run a "
            "Python script."
        )


def _multinode_runner(settings: Settings, machines: int) -> DistributedKind | None:
    """The requested backend whose own runner starts every machine, when it is to be used.

    Only on several machines, and not with the "standard" multi-node launcher (torchrun on each
    machine, which the elastic plan does).
    """
    launcher = settings.deepspeed_multinode_launcher or "pdsh"
    if machines <= 1 or launcher == "standard":
        return None
    return next((k for k in requested_backends(settings) if k.multinode_runner is not None), None)
