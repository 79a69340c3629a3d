"""What a launch tells the user: choices made on their behalf, unused options, warnings, the automatic layout."""

from __future__ import annotations

import os
from typing import Any

from accelerando.backends.strategies import DISTRIBUTED_KINDS
from accelerando.core.settings.fields import FIELDS, FIELDS_BY_NAME
from accelerando.core.settings.machine import MachineInfo
from accelerando.core.settings.resolve import Settings
from accelerando.launchers.plan.argv import rendezvous_backend
from accelerando.launchers.plan.checks import _where

__all__ = ["automatic_layout", "oversubscription_warning"]


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


def _auto_setting_notes(settings: Settings) -> list[str]:
    """One note per backend setting left at "auto": it is decided at prepare(), not by the launcher."""
    return [
        f"{what}: auto ({settings.source(name)}): chosen at prepare() from the model's size and each "
        "device's memory; the choice and its reason are logged then"
        for name, what in (item for kind in DISTRIBUTED_KINDS for item in kind.auto_settings)
        if settings[name] in ("auto", "AUTO")
    ]


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
    failures = (
        f"a failed process restarts them up to {restarts} time(s) (--max_restarts)"
        if restarts
        else "a failed process ends the job (pass --max_restarts N to let the others go on)"
    )
    return (
        f"elastic range {low}:{high} machines through the {backend} rendezvous{chosen}: training starts once "
        f"{low} machine(s) joined and the last call ({settings.rdzv_last_call_timeout} s, "
        f"--rdzv_last_call_timeout) passed, and re-forms when a machine joins; a machine silent for "
        f"{settings.rdzv_peer_timeout} s (--rdzv_peer_timeout) is dropped and the others restart without it; "
        f"{failures}"
    )


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
    from accelerando.core import parallelism_layout as pl  # only `--parallelism auto` needs the layout rules

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
