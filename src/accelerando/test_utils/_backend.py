"""Which device family tests run on here, how many devices it has, and what is installed.

Hardware questions never initialise a device runtime (the answers come from ``accelerando.core.devices``
and ``accelerando.common.imports``), so importing the test helpers keeps a later ``fork`` possible.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from accelerando.common import imports
from accelerando.core.devices.detect import detect_device_backend

__all__ = ["available", "family_count", "get_backend"]

# Families the devices package does not model (vendor plug-ins register ``torch.<name>``).
_PLUGIN_FAMILIES = ("mlu", "musa", "sdaa", "neuron")


def available(check: str, *modules: str) -> bool:
    """Answer ``accelerando.common.imports.<check>()``; without such a check, whether ``modules`` import.

    Args:
        check: the name of an ``is_*_available`` function.
        *modules: top-level module names that must all be importable when ``check`` does not exist.

    Returns:
        The check's answer (or the modules' availability).
    """
    fn = getattr(imports, check, None)
    if fn is not None:
        return bool(fn())
    return bool(modules) and all(imports.is_package_available(name) for name in modules)


def family_count(name: str) -> int:
    """Number of visible devices of family ``name`` (``cuda``, ``xpu``, ...); 0 when absent."""
    module = getattr(torch, name, None)
    if module is None or not hasattr(module, "device_count"):
        return 0
    try:
        return int(module.device_count())
    except (RuntimeError, AssertionError):
        return 0


def _xla_count() -> int:
    try:
        import torch_xla.runtime as xr

        return int(xr.global_runtime_device_count())
    except (ImportError, RuntimeError, AttributeError):
        return 1


def _cpu_memory_allocated() -> int:
    return 0


def get_backend() -> tuple[str, int, Callable[[], int]]:
    """Return ``(device_type, device_count, memory_allocated_func)`` for the tests of this machine.

    The device type is ``"xla"`` when torch_xla is usable, else the first accelerator family found
    (cuda, xpu, npu, hpu, mps, then plug-in families mlu/musa/sdaa/neuron), else ``"cpu"`` with a
    count of 1 and a memory function that returns 0.
    """
    if imports.is_torch_xla_available():
        return "xla", _xla_count(), _cpu_memory_allocated

    backend = detect_device_backend()
    name = backend.name
    if name == "cpu":
        for plugin in _PLUGIN_FAMILIES:
            if family_count(plugin) > 0:
                name = plugin
                break
    if name == "cpu":
        return "cpu", 1, _cpu_memory_allocated
    count = family_count(name) or 1
    # torch.<family>.memory_allocated(), when the family module has one.
    memory: Callable[[], int] | None = getattr(getattr(torch, name, None), "memory_allocated", None)
    return name, count, memory if callable(memory) else _cpu_memory_allocated
