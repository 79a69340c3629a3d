"""The environment a launch gives its processes: every setting some layer set, under our names and the reference's.

The launch plan is the only place that writes environment variables for the processes (see the
package's docstring).
"""

from __future__ import annotations

import json
from typing import Any

from accelerando.core.settings.fields import FIELDS_BY_NAME, Field, fields_in_group
from accelerando.core.settings.machine import SOCKET_IFNAME_ENV, MachineInfo
from accelerando.core.settings.resolve import ECHOED_DEFAULTS_ENV, SOURCES_ENV, Settings
from accelerando.launchers.plan.checks import machine_counts, parallelism_requested

__all__ = ["INSTALL_ENV", "export_env", "loopback_sockets", "reference_env"]

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
        env[SOURCES_ENV] = json.dumps({name: settings.origin(name) for name in exported}, sort_keys=True)
    if parallelism_requested(settings) and not settings.use_parallelism_config:
        env[FIELDS_BY_NAME["use_parallelism_config"].our_env] = "true"
    reference, echoed = reference_env(settings)
    env.update(reference)
    if echoed:
        env[ECHOED_DEFAULTS_ENV] = json.dumps(echoed, sort_keys=True)
    return env


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
