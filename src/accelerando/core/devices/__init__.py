"""Device backends: one class per hardware family. ``detect_device_backend`` picks the best present.

Names resolve lazily (PEP 562): ``accelerando.core.devices.counting`` (GPU counting for the launcher)
stays importable without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelerando.core._lazy import lazy_getattr

if TYPE_CHECKING:
    from accelerando.core.devices.base import DeviceBackend
    from accelerando.core.devices.counting import visible_gpu_count
    from accelerando.core.devices.detect import DEVICE_BACKENDS, backend_for, detect_device_backend
    from accelerando.core.devices.families import (
        CPUBackend,
        CUDABackend,
        HPUBackend,
        MPSBackend,
        NPUBackend,
        XPUBackend,
    )

_EXPORTS = {
    "DeviceBackend": "accelerando.core.devices.base",
    "CPUBackend": "accelerando.core.devices.families",
    "CUDABackend": "accelerando.core.devices.families",
    "HPUBackend": "accelerando.core.devices.families",
    "MPSBackend": "accelerando.core.devices.families",
    "NPUBackend": "accelerando.core.devices.families",
    "XPUBackend": "accelerando.core.devices.families",
    "DEVICE_BACKENDS": "accelerando.core.devices.detect",
    "backend_for": "accelerando.core.devices.detect",
    "detect_device_backend": "accelerando.core.devices.detect",
    "visible_gpu_count": "accelerando.core.devices.counting",
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
