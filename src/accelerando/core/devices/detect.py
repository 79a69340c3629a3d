"""Which device family this process uses: the preference order and the lookups by name."""

from __future__ import annotations

from accelerando.core.devices.base import DeviceBackend
from accelerando.core.devices.families import (
    CPUBackend,
    CUDABackend,
    HPUBackend,
    MPSBackend,
    NPUBackend,
    XPUBackend,
)

__all__ = ["DEVICE_BACKENDS", "backend_for", "detect_device_backend"]

# Preference order when several families are present; CPU is the fallback.
DEVICE_BACKENDS: tuple[type[DeviceBackend], ...] = (
    CUDABackend,
    XPUBackend,
    NPUBackend,
    HPUBackend,
    MPSBackend,
    CPUBackend,
)


def detect_device_backend(cpu: bool = False) -> type[DeviceBackend]:
    """Return the first available accelerator family, or CPU when ``cpu`` or none is present."""
    if cpu:
        return CPUBackend
    for backend in DEVICE_BACKENDS:
        if backend.is_available():
            return backend
    return CPUBackend


def backend_for(device: str) -> type[DeviceBackend]:
    """Return the backend class for a device type name (``"cuda"``, ``"cpu"``, ...).

    Raises:
        ValueError: the name is not a known family.
    """
    for backend in DEVICE_BACKENDS:
        if backend.name == device:
            return backend
    raise ValueError(f"unknown device type {device!r}; expected one of {[b.name for b in DEVICE_BACKENDS]}")
