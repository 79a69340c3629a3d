"""The hardware families accelerando knows. Each is a few declarations over ``DeviceBackend``."""

from __future__ import annotations

import torch
from typing_extensions import override

from accelerando.core.devices.base import DeviceBackend

__all__ = ["CPUBackend", "CUDABackend", "HPUBackend", "MPSBackend", "NPUBackend", "XPUBackend"]


class CPUBackend(DeviceBackend):
    """The host CPU: always available, gloo for collectives, one device for every process."""

    name = "cpu"
    data_parallel_type = "MULTI_CPU"
    dist_backend = "gloo"

    @override
    @classmethod
    def is_available(cls) -> bool:
        return True

    @override
    @classmethod
    def device_count(cls) -> int:
        return 1

    @override
    @classmethod
    def device(cls, local_rank: int = 0) -> torch.device:
        return torch.device("cpu")

    @override
    @classmethod
    def set_device(cls, device: torch.device) -> None:
        return None

    @override
    @classmethod
    def get_rng_state(cls) -> torch.Tensor | None:
        return torch.get_rng_state()

    @override
    @classmethod
    def set_rng_state(cls, state: torch.Tensor) -> None:
        torch.set_rng_state(state)

    @override
    @classmethod
    def empty_cache(cls) -> None:
        return None

    @override
    @classmethod
    def synchronize(cls) -> None:
        return None

    @override
    @classmethod
    def memory_stats(cls) -> dict[str, int]:
        return {}

    @override
    @classmethod
    def total_memory(cls, index: int = 0) -> int | None:
        import psutil

        return int(psutil.virtual_memory().total)


class CUDABackend(DeviceBackend):
    """NVIDIA (and ROCm) GPUs through ``torch.cuda``; nccl for collectives."""

    name = "cuda"
    data_parallel_type = "MULTI_GPU"
    dist_backend = "nccl"
    rng_type = "cuda"
    supports_pin_memory = True


class MPSBackend(DeviceBackend):
    """Apple silicon GPUs; a single device, no multi-process backend."""

    name = "mps"
    data_parallel_type = "MULTI_CPU"
    dist_backend = "gloo"
    rng_type = "mps"

    @override
    @classmethod
    def is_available(cls) -> bool:
        mps = getattr(torch.backends, "mps", None)
        return bool(mps is not None and mps.is_available() and mps.is_built())

    @override
    @classmethod
    def device_count(cls) -> int:
        return 1 if cls.is_available() else 0

    @override
    @classmethod
    def device(cls, local_rank: int = 0) -> torch.device:
        return torch.device("mps")


class XPUBackend(DeviceBackend):
    """Intel GPUs through ``torch.xpu``; xccl for collectives."""

    name = "xpu"
    data_parallel_type = "MULTI_XPU"
    dist_backend = "xccl"
    rng_type = "xpu"
    supports_pin_memory = True


class NPUBackend(DeviceBackend):
    """Ascend NPUs (torch_npu registers ``torch.npu``); hccl for collectives."""

    name = "npu"
    data_parallel_type = "MULTI_NPU"
    dist_backend = "hccl"
    rng_type = "npu"


class HPUBackend(DeviceBackend):
    """Intel Gaudi HPUs (habana_frameworks registers ``torch.hpu``); hccl for collectives."""

    name = "hpu"
    data_parallel_type = "MULTI_HPU"
    dist_backend = "hccl"
    rng_type = "hpu"
