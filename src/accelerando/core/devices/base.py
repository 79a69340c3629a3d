"""The device-backend contract: one hardware family (cpu, cuda, mps, xpu, npu, hpu)."""

from __future__ import annotations

from types import ModuleType

import torch

__all__ = ["DeviceBackend"]


class DeviceBackend:
    """What accelerando needs to know about one family of devices.

    Subclasses set ``name`` (the torch device type), ``dist_backend`` (process-group backend),
    ``data_parallel_type`` (the ``DistributedType`` value a plain multi-process job on this family
    reports) and ``rng_type``, and override ``is_available`` without initialising the device runtime (so a later
    fork, e.g. by notebook_launcher, stays possible).
    """

    name: str = "cpu"
    dist_backend: str = "gloo"
    data_parallel_type: str = "MULTI_CPU"
    rng_type: str | None = None
    supports_pin_memory: bool = False

    @classmethod
    def is_available(cls) -> bool:
        """Return whether at least one device of this family is usable.

        The default asks ``torch.<name>.is_available()``, which counts devices without creating a
        context (so a later fork, e.g. by notebook_launcher, stays possible); a family whose torch
        module is not registered (plug-in not installed) is unavailable.
        """
        mod = getattr(torch, cls.name, None)
        return bool(mod is not None and mod.is_available())

    @classmethod
    def module(cls) -> ModuleType:
        """The ``torch.<name>`` module (``torch.cuda``, ``torch.xpu``, ...)."""
        return getattr(torch, cls.name)

    @classmethod
    def device_count(cls) -> int:
        """Number of visible devices."""
        return int(cls.module().device_count()) if cls.is_available() else 0

    @classmethod
    def device(cls, local_rank: int = 0) -> torch.device:
        """The device this process should use given its local rank."""
        count = max(cls.device_count(), 1)
        return torch.device(cls.name, local_rank % count)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        """Make ``device`` current for this process."""
        mod = cls.module()
        if hasattr(mod, "set_device"):
            mod.set_device(device)

    @classmethod
    def get_rng_state(cls) -> torch.Tensor | None:
        """RNG state of the current device, or None where the family has none."""
        return cls.module().get_rng_state() if cls.is_available() else None

    @classmethod
    def set_rng_state(cls, state: torch.Tensor) -> None:
        """Restore an RNG state returned by ``get_rng_state``."""
        cls.module().set_rng_state(state)

    @classmethod
    def empty_cache(cls) -> None:
        """Release cached memory held by the allocator."""
        mod = cls.module()
        if cls.is_available() and hasattr(mod, "empty_cache"):
            mod.empty_cache()

    @classmethod
    def synchronize(cls) -> None:
        """Wait for queued work on the current device."""
        mod = cls.module()
        if cls.is_available() and hasattr(mod, "synchronize"):
            mod.synchronize()

    @classmethod
    def memory_stats(cls) -> dict[str, int]:
        """Allocated / reserved / peak bytes on the current device ({} where unknown)."""
        mod = cls.module()
        if not cls.is_available() or not hasattr(mod, "memory_allocated"):
            return {}
        stats = {"allocated": int(mod.memory_allocated())}
        for key, fn in (("reserved", "memory_reserved"), ("peak", "max_memory_allocated")):
            if hasattr(mod, fn):
                stats[key] = int(getattr(mod, fn)())
        return stats

    @classmethod
    def total_memory(cls, index: int = 0) -> int | None:
        """Bytes of memory of device ``index``, where the family reports it."""
        mod = cls.module()
        if cls.is_available() and hasattr(mod, "get_device_properties"):
            return int(mod.get_device_properties(index).total_memory)
        return None
