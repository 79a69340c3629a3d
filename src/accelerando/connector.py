"""Settings + detection -> (distributed type, strategy, precision).

This is the ONLY module that maps settings to a ``DistributedType`` or compares with one; strategies
declare the type they report. The decisions are taken in numbered steps so each can be read alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelerando.devices import DeviceBackend
from accelerando.enums import DistributedType

__all__ = ["Decision", "decide", "process_distributed_type"]

_MULTI_BY_DEVICE = {
    "cpu": DistributedType.MULTI_CPU,
    "cuda": DistributedType.MULTI_GPU,
    "xpu": DistributedType.MULTI_XPU,
    "npu": DistributedType.MULTI_NPU,
    "hpu": DistributedType.MULTI_HPU,
    "mps": DistributedType.MULTI_CPU,
}


def process_distributed_type(device_backend: type[DeviceBackend], num_processes: int) -> DistributedType:
    """The data-parallel type a plain job of ``num_processes`` on this device family reports."""
    if num_processes <= 1:
        return DistributedType.NO
    return _MULTI_BY_DEVICE.get(device_backend.name, DistributedType.MULTI_CPU)


@dataclass(frozen=True)
class Decision:
    """What the connector decided, with the reason for the strategy choice."""

    distributed_type: DistributedType
    strategy_name: str
    reason: str


def decide(
    *,
    num_processes: int,
    process_type: DistributedType,
    deepspeed_requested: bool,
    fsdp_requested: bool,
    megatron_requested: bool,
    requested_type: str | None,
    requested_type_source: str = "default",
    device_name: str = "cpu",
) -> Decision:
    """Choose the distributed type and strategy.

    Steps: (1) an explicit backend plugin or launcher flag (DeepSpeed, FSDP, Megatron-LM) wins;
    (2) otherwise several processes mean DDP; (3) one process means the single-device strategy.
    A launcher request that cannot be honoured here (e.g. MULTI_GPU on a machine with no GPU) is an
    error naming where the request came from.

    Raises:
        ValueError: contradictory requests, with both sources named.
    """
    if requested_type in (DistributedType.MULTI_GPU.value,) and device_name != "cuda":
        raise ValueError(
            f"distributed_type=MULTI_GPU (from {requested_type_source}) but this machine has no usable GPU "
            f"(device detected: {device_name}); launch with --cpu / distributed_type: MULTI_CPU, "
            "or run on a GPU machine"
        )
    if deepspeed_requested:
        return Decision(DistributedType.DEEPSPEED, "deepspeed", "a DeepSpeed plugin or --use_deepspeed")
    if fsdp_requested:
        return Decision(DistributedType.FSDP, "fsdp", "an FSDP plugin or --use_fsdp")
    if megatron_requested:
        return Decision(DistributedType.MEGATRON_LM, "megatron", "a Megatron-LM plugin or --use_megatron_lm")
    if process_type is not DistributedType.NO:
        return Decision(process_type, "ddp", f"{num_processes} processes")
    return Decision(DistributedType.NO, "single", "one process")
