"""Read memory: this process's RSS and peak RSS, its children's RSS, the accelerator's allocator
counters and, on NVIDIA GPUs, the NVML sensors.

Readers are built once and then read every sampled step, so each read costs tens of microseconds:
procfs files stay open and optional libraries (psutil, pynvml) are imported when a reader is built.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from accelerando.common import imports
from accelerando.core.devices import detect_device_backend
from accelerando.logging import get_logger

if TYPE_CHECKING:
    import psutil

__all__ = ["DeviceMemoryReader", "ProcessMemoryReader"]

logger = get_logger(__name__)


class ProcessMemoryReader:
    """Reads this process's RSS and peak RSS (Linux: /proc and getrusage), falling back to psutil."""

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self._children: list[psutil.Process] = []
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            # Kept open: re-reading an open procfs file costs a fraction of opening it each step.
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
            self._clear_refs: int | None = os.open("/proc/self/clear_refs", os.O_WRONLY)
        except OSError:
            self._statm = -1
            self._clear_refs = None

    def rss_and_peak(self) -> tuple[int, int]:
        """Return ``(rss, peak rss since the previous call)`` of this process, in bytes."""
        if self._clear_refs is None:
            rss = int(self._process.memory_info().rss)
            return rss, rss
        import resource

        rss = int(os.pread(self._statm, 256, 0).split()[1]) * self._page
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        try:
            # "5" resets the kernel's peak-RSS mark, so the next getrusage reports the next step's peak.
            os.write(self._clear_refs, b"5")
        except OSError:
            self.close()
        return rss, max(peak, rss)

    def close(self) -> None:
        """Close the procfs files kept open; later reads fall back to psutil."""
        for fd in (self._statm, self._clear_refs):
            if fd is not None and fd >= 0:
                os.close(fd)
        self._statm, self._clear_refs = -1, None

    def refresh_children(self) -> None:
        """List this process's child processes again (dataloader workers come and go)."""
        import psutil

        try:
            self._children = self._process.children(recursive=True)
        except psutil.Error:
            self._children = []

    def children_rss(self) -> int:
        """Return the summed RSS of the child processes found by the last :meth:`refresh_children`."""
        import psutil

        total = 0
        for child in self._children:
            try:
                total += int(child.memory_info().rss)
            except psutil.Error:
                continue
        return total


class DeviceMemoryReader:
    """Allocator counters of the accelerator in use, plus NVML sensors on NVIDIA GPUs."""

    def __init__(self, use_nvml: bool) -> None:
        import torch

        self.backend = detect_device_backend()
        self._module = getattr(torch, self.backend.name, None)
        self._nvml: ModuleType | None = None
        self._handle: object = None  # NVML's opaque device handle
        if use_nvml and self.backend.name == "cuda":
            self._open_nvml(torch)

    def _open_nvml(self, torch: ModuleType) -> None:
        # The package checks are generated in accelerando.common.imports, out of static analysis' sight.
        is_pynvml_available: Callable[[], bool] = getattr(imports, "is_pynvml_available")  # noqa: B009
        if not is_pynvml_available():
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = torch.cuda.current_device()
            uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", ""))
            try:
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}" if uuid else "")
            except pynvml.NVMLError:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - NVML missing or driver mismatch: sensors are optional
            logger.warning(f"MemoryMonitor: NVML unavailable ({exc}); GPU temperature/power not recorded.")
            self._nvml = None

    def memory(self) -> dict[str, int]:
        """Return the allocator counters as ``device_<name>`` (empty on CPU) and reset the peak counter."""
        if self.backend.name == "cpu" or self._module is None:
            return {}
        import torch

        if self.backend.name == "cuda" and not torch.cuda.is_initialized():
            return {}
        stats = self.backend.memory_stats()
        out = {f"device_{key}": value for key, value in stats.items()}
        if hasattr(self._module, "reset_peak_memory_stats"):
            self._module.reset_peak_memory_stats()
        return out

    def sensors(self) -> dict[str, float]:
        """Return the NVML temperature, power and utilisation readings (empty without NVML)."""
        if self._nvml is None:
            return {}
        nvml, handle = self._nvml, self._handle
        out: dict[str, float] = {}
        try:
            out["gpu_temperature_c"] = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            out["gpu_power_w"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            out["gpu_utilization_pct"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError:
            pass
        return out

    def close(self) -> None:
        """Shut NVML down if it was opened."""
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None
