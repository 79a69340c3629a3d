"""Automatic FSDP sharding: the least sharding whose estimated memory fits each device.

The strategy calls :func:`choose_sharding_strategy` when the plugin's sharding strategy is "AUTO";
the estimate is plain arithmetic (no process group, no FSDP import).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ShardingChoice", "choose_sharding_strategy", "estimate_sharding_memory"]


@dataclass(frozen=True)
class ShardingChoice:
    """The outcome of :func:`choose_sharding_strategy`.

    Attributes:
        strategy: NO_SHARD, SHARD_GRAD_OP or FULL_SHARD.
        cpu_offload: whether sharded state lives in CPU memory.
        bytes_per_process: estimated device bytes per process for the choice.
        budget_bytes: usable device bytes per process (memory minus headroom).
        reason: one line per candidate considered, saying why it was taken or skipped.
    """

    strategy: str
    cpu_offload: bool
    bytes_per_process: int
    budget_bytes: int
    reason: str


_CANDIDATES = (("NO_SHARD", False), ("SHARD_GRAD_OP", False), ("FULL_SHARD", False), ("FULL_SHARD", True))


def estimate_sharding_memory(
    num_params: int,
    num_processes: int,
    strategy: str,
    *,
    cpu_offload: bool = False,
    compute_bytes: int = 4,
    optimizer_bytes_per_param: int = 8,
    largest_unit_params: int = 0,
) -> int:
    """Estimate device bytes per process for model state under one sharding strategy.

    The model: each parameter has an fp32 master copy (4 bytes), an fp32 gradient (4 bytes) and
    ``optimizer_bytes_per_param`` of optimizer state (8 for Adam's two moments); this "state" is
    replicated (NO_SHARD) or divided by ``num_processes``. Computation needs parameters gathered in
    ``compute_bytes`` each: all of them between forward and backward for SHARD_GRAD_OP, two wrapped
    units at a time (current + prefetched) for FULL_SHARD. A low-precision compute copy adds to
    NO_SHARD too. Activations are not counted: that is what the headroom is for.

    Args:
        num_params: parameters of the model.
        num_processes: processes sharing the state.
        strategy: NO_SHARD, SHARD_GRAD_OP or FULL_SHARD.
        cpu_offload: sharded state in CPU memory (only the gathered units stay on the device).
        compute_bytes: bytes of a parameter as computed (2 under a bf16/fp16 parameter policy).
        optimizer_bytes_per_param: optimizer state bytes per parameter.
        largest_unit_params: parameters of the largest wrapped unit.

    Returns:
        Estimated bytes per process.

    Raises:
        ValueError: an unknown strategy or non-positive process count.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes={num_processes} must be >= 1")
    state = num_params * (4 + 4 + optimizer_bytes_per_param)
    gathered_units = 2 * largest_unit_params * compute_bytes
    if strategy == "NO_SHARD":
        return state + (num_params * compute_bytes if compute_bytes != 4 else 0)
    if strategy == "SHARD_GRAD_OP":
        return state // num_processes + num_params * compute_bytes
    if strategy == "FULL_SHARD":
        return gathered_units + (0 if cpu_offload else state // num_processes)
    raise ValueError(f"strategy={strategy!r}; estimate NO_SHARD, SHARD_GRAD_OP or FULL_SHARD")


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.3g} GiB"


def choose_sharding_strategy(
    num_params: int,
    num_processes: int,
    device_memory_bytes: int,
    *,
    compute_bytes: int = 4,
    optimizer_bytes_per_param: int = 8,
    largest_unit_params: int = 0,
    headroom: float = 0.2,
    cpu_memory_bytes: int | None = None,
) -> ShardingChoice:
    """Pick the least sharding whose estimated memory fits each device.

    Candidates, in order: NO_SHARD (no communication beyond DDP's), SHARD_GRAD_OP, FULL_SHARD,
    FULL_SHARD with CPU offload. The first whose estimate (see :func:`estimate_sharding_memory`)
    fits in ``device_memory_bytes * (1 - headroom)`` wins.

    Args:
        num_params: parameters of the model.
        num_processes: processes sharing the model.
        device_memory_bytes: memory of one process's device.
        compute_bytes: bytes per parameter as computed (2 for a bf16/fp16 parameter policy).
        optimizer_bytes_per_param: optimizer state bytes per parameter (8 for Adam, 4 for SGD with
            momentum, 0 for plain SGD).
        largest_unit_params: parameters of the largest wrapped unit.
        headroom: fraction of device memory kept for activations and allocator slack.
        cpu_memory_bytes: CPU memory per process available for offloaded state (None = unknown,
            offload assumed to fit).

    Returns:
        The :class:`ShardingChoice`, with a reason naming every candidate considered.

    Raises:
        ValueError: invalid arguments, or nothing fits (the message gives the sizes and what to do).
    """
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom={headroom} must be in [0, 1)")
    if device_memory_bytes <= 0 or num_params < 0:
        raise ValueError("device_memory_bytes must be > 0 and num_params >= 0")
    budget = int(device_memory_bytes * (1.0 - headroom))
    lines = []
    for strategy, offload in _CANDIDATES:
        need = estimate_sharding_memory(
            num_params,
            num_processes,
            strategy,
            cpu_offload=offload,
            compute_bytes=compute_bytes,
            optimizer_bytes_per_param=optimizer_bytes_per_param,
            largest_unit_params=largest_unit_params,
        )
        label = strategy + (" + CPU offload" if offload else "")
        if offload and cpu_memory_bytes is not None:
            host_need = num_params * (8 + optimizer_bytes_per_param) // num_processes
            if host_need > cpu_memory_bytes:
                lines.append(
                    f"{label}: needs {_gib(host_need)} of CPU memory per process > {_gib(cpu_memory_bytes)}"
                )
                continue
        if need <= budget:
            lines.append(f"{label}: needs {_gib(need)} per process <= {_gib(budget)} usable: chosen")
            return ShardingChoice(strategy, offload, need, budget, "; ".join(lines))
        lines.append(f"{label}: needs {_gib(need)} per process > {_gib(budget)} usable")
    raise ValueError(
        f"a model of {num_params:,} parameters does not fit {num_processes} process(es) with "
        f"{_gib(device_memory_bytes)} each ({'; '.join(lines)}); use more processes, a bf16 parameter "
        "policy, a smaller optimizer state, or set a sharding strategy explicitly"
    )
