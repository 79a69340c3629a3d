"""Automatic ZeRO configuration: the lowest stage (then the least offload) whose memory fits.

The estimate follows the ZeRO paper's accounting for Adam-style optimizers: per parameter, the
weights and gradients take ``w`` bytes each (2 in fp16/bf16, 4 in fp32), and the optimizer state
takes ``k`` bytes (12 in mixed precision: fp32 master copy + two moments; 8 in fp32: two moments).
ZeRO-1 divides the optimizer state by the number of processes, ZeRO-2 also the gradients, ZeRO-3
also the weights. Optimizer offload moves the optimizer state and the gradient partition to CPU RAM;
parameter offload (ZeRO-3) moves the weights too.
Activations are not modelled: a ``headroom`` fraction of device memory is kept free for them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["ZeroChoice", "choose_zero_config", "estimate_zero_memory"]

logger = logging.getLogger(__name__)

_GIB = 1024**3


@dataclass(frozen=True)
class ZeroChoice:
    """The outcome of :func:`choose_zero_config`.

    Attributes:
        stage: ZeRO stage 0-3.
        offload_optimizer_device: ``"none"`` or ``"cpu"``.
        offload_param_device: ``"none"`` or ``"cpu"``.
        device_bytes: estimated bytes per process on the device for this choice.
        cpu_bytes: estimated bytes of CPU RAM per process for the offloaded state.
        reason: one human-readable sentence saying why this choice was made.
    """

    stage: int
    offload_optimizer_device: str
    offload_param_device: str
    device_bytes: int
    cpu_bytes: int
    reason: str


def _bytes_per_param(mixed_precision: str) -> tuple[int, int]:
    """(weight/gradient bytes, optimizer-state bytes) per parameter."""
    if mixed_precision in ("fp16", "bf16", "fp8"):
        return 2, 12
    return 4, 8


def estimate_zero_memory(
    num_params: int,
    num_processes: int,
    stage: int,
    mixed_precision: str = "no",
    offload_optimizer: bool = False,
    offload_param: bool = False,
) -> tuple[int, int]:
    """Estimate per-process (device bytes, CPU bytes) for model states under one ZeRO setup.

    Args:
        num_params: number of model parameters.
        num_processes: data-parallel processes sharing the states.
        stage: ZeRO stage 0-3.
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``.
        offload_optimizer: optimizer state lives in CPU RAM.
        offload_param: weights live in CPU RAM (ZeRO-3 only).

    Returns:
        ``(device_bytes, cpu_bytes)`` for one process.

    Raises:
        ValueError: a stage outside 0-3, a non-positive process count, or parameter offload below ZeRO-3.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if offload_param and stage != 3:
        raise ValueError("parameter offload needs ZeRO stage 3; set stage=3 or offload_param=False")
    w, k = _bytes_per_param(mixed_precision)
    n = num_processes
    weights = num_params * w / (n if stage >= 3 else 1)
    grads = num_params * w / (n if stage >= 2 else 1)
    optim = num_params * k / (n if stage >= 1 else 1)
    device = 0.0
    cpu = 0.0
    # ZeRO-Offload keeps the gradient partition next to the optimizer state it feeds.
    if offload_optimizer:
        cpu += optim + (grads if stage >= 2 else 0)
        device += grads if stage < 2 else 0
    else:
        device += optim + grads
    if offload_param:
        cpu += weights
    else:
        device += weights
    return int(device), int(cpu)


def _candidates(num_processes: int) -> list[tuple[int, bool, bool]]:
    """Choices in order of preference: fewest communication first, offload last."""
    stages = [0, 1, 2, 3] if num_processes > 1 else [0]
    offloads = [(2, True, False), (3, True, False), (3, True, True)]
    return [(s, False, False) for s in stages] + offloads


def _reason(
    stage: int,
    off_opt: bool,
    off_param: bool,
    device: int,
    cpu: int,
    budget: float,
    procs: int,
    total_gib: float,
) -> str:
    """One sentence explaining a choice, for the log and for ``--dry-run`` / ``accelerando env``."""
    what = f"ZeRO-{stage}" + (" with optimizer offload" if off_opt else "")
    what += " and parameter offload" if off_param else ""
    reason = (
        f"{what}: model states need {device / _GIB:.2f} GiB per device "
        f"(of {budget / _GIB:.2f} GiB usable, {procs} process(es), {total_gib:.2f} GiB unsharded)"
    )
    if stage > 0 or off_opt:
        reason += "; every lower stage without offload does not fit"
    if off_opt:
        reason += f"; {cpu / _GIB:.2f} GiB per process offloaded to CPU RAM"
    return reason


def choose_zero_config(
    num_params: int,
    device_memory: int,
    num_processes: int,
    cpu_memory: int | None = None,
    mixed_precision: str = "no",
    headroom: float = 0.2,
) -> ZeroChoice:
    """Pick the lowest ZeRO stage whose model states fit in each device, then offload only if needed.

    Order tried: stages 0, 1, 2, 3 without offload (one process: stage 0 only, since sharding across
    one process saves nothing), then ZeRO-2 with optimizer offload, ZeRO-3 with optimizer offload,
    ZeRO-3 with optimizer and parameter offload. The first that fits wins and is logged with its reason.

    Args:
        num_params: number of model parameters.
        device_memory: bytes of memory of ONE device (per process).
        num_processes: data-parallel processes.
        cpu_memory: bytes of CPU RAM available to the processes of one machine together; None =
            unknown (offload then assumed to fit).
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"`` (changes bytes per parameter).
        headroom: fraction of device and CPU memory kept free for activations and buffers.

    Returns:
        The :class:`ZeroChoice`.

    Raises:
        ValueError: invalid arguments, or nothing fits even with full offload (the message gives the
            estimate and the fixes: more processes, more memory, or NVMe offload in the config).
    """
    if num_params < 0 or device_memory <= 0:
        raise ValueError(
            f"num_params must be >= 0 and device_memory > 0 bytes, got {num_params} and {device_memory}"
        )
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    device_budget = device_memory * (1 - headroom)
    cpu_budget = None if cpu_memory is None else cpu_memory * (1 - headroom) / max(num_processes, 1)
    total_gib = num_params * sum(_bytes_per_param(mixed_precision)) / _GIB
    for stage, off_opt, off_param in _candidates(num_processes):
        device, cpu = estimate_zero_memory(
            num_params, num_processes, stage, mixed_precision, off_opt, off_param
        )
        if device > device_budget or (cpu_budget is not None and cpu > cpu_budget):
            continue
        reason = _reason(stage, off_opt, off_param, device, cpu, device_budget, num_processes, total_gib)
        choice = ZeroChoice(
            stage, "cpu" if off_opt else "none", "cpu" if off_param else "none", device, cpu, reason
        )
        logger.info("automatic DeepSpeed configuration: %s", reason)
        return choice
    raise ValueError(
        f"the model's states ({total_gib:.2f} GiB unsharded, {num_params} parameters) do not fit "
        f"even with ZeRO-3 and full CPU offload on {num_processes} process(es) with "
        f"{device_memory / _GIB:.2f} GiB per device; use more processes, more memory, or set "
        "offload devices to 'nvme' with an nvme_path in the DeepSpeed config"
    )
