"""Device backends: one class per hardware family. ``detect_device_backend`` picks the best present.

Names resolve lazily (PEP 562): ``accelerando.devices.counting`` (GPU counting for the launcher)
stays importable without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelerando._lazy import lazy_getattr

if TYPE_CHECKING:
    from accelerando.devices.base import DeviceBackend
    from accelerando.devices.counting import visible_gpu_count
    from accelerando.devices.detect import DEVICE_BACKENDS, backend_for, detect_device_backend
    from accelerando.devices.families import (
        CPUBackend,
        CUDABackend,
        HPUBackend,
        MPSBackend,
        NPUBackend,
        XPUBackend,
    )

_EXPORTS = {
    "DeviceBackend": "accelerando.devices.base",
    "CPUBackend": "accelerando.devices.families",
    "CUDABackend": "accelerando.devices.families",
    "HPUBackend": "accelerando.devices.families",
    "MPSBackend": "accelerando.devices.families",
    "NPUBackend": "accelerando.devices.families",
    "XPUBackend": "accelerando.devices.families",
    "DEVICE_BACKENDS": "accelerando.devices.detect",
    "backend_for": "accelerando.devices.detect",
    "detect_device_backend": "accelerando.devices.detect",
    "visible_gpu_count": "accelerando.devices.counting",
}

__all__ = [
    "DEVICE_BACKENDS",
    "CPUBackend",
    "CUDABackend",
    "DeviceBackend",
    "HPUBackend",
    "MPSBackend",
    "NPUBackend",
    "XPUBackend",
    "backend_for",
    "detect_device_backend",
    "visible_gpu_count",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS, globals(), submodules=True)
