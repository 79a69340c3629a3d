"""Capture and restore every random number generator of this process, in a weights-only-safe form.

``accelerando.common.random.get_rng_states`` / ``set_rng_states`` are used when that module provides
them; otherwise the generators are captured here: Python ``random``, NumPy's global generator,
torch's CPU generator and each initialised accelerator's generators (CUDA, XPU, MPS, NPU, ...).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import torch

from accelerando.common import random as shared_random

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType

__all__ = ["capture_rng_states", "restore_rng_states"]

_NDARRAY_TAG = "__ndarray__"


def _to_plain(value: object) -> object:
    """Turn NumPy arrays inside a nested structure into tagged lists (loadable with weights_only)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return value
    if isinstance(value, np.ndarray):
        return {_NDARRAY_TAG: value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(type(v) is int for v in value):  # e.g. Python's random state (625 ints): nothing to convert
            return value
        return type(value)(_to_plain(v) for v in value)
    return value


def _from_plain(value: object) -> object:
    """Inverse of :func:`_to_plain`."""
    if isinstance(value, dict):
        if _NDARRAY_TAG in value:
            import numpy as np

            return np.asarray(value[_NDARRAY_TAG], dtype=value["dtype"])
        return {k: _from_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_from_plain(v) for v in value)
    return value


def _shared_helpers() -> tuple[Callable[[], object], Callable[[object], object]] | None:
    """The RNG helpers of ``accelerando.common.random`` if that module provides them."""
    get = getattr(shared_random, "get_rng_states", None)
    put = getattr(shared_random, "set_rng_states", None)
    return (get, put) if callable(get) and callable(put) else None


def _device_modules() -> list[tuple[str, ModuleType]]:
    """Accelerator modules whose generators exist in this process (initialised, so no side effect)."""
    found: list[tuple[str, ModuleType]] = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        found.append(("cuda", torch.cuda))
    for name in ("xpu", "npu", "mlu", "musa", "hpu"):
        module = getattr(torch, name, None)
        is_init = getattr(module, "is_initialized", None)
        if module is not None and callable(is_init) and is_init() and hasattr(module, "get_rng_state_all"):
            found.append((name, module))
    return found


def _capture_local() -> dict[str, object]:
    import numpy as np

    states: dict[str, object] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    for name, module in _device_modules():
        states[name] = module.get_rng_state_all()
    if torch.backends.mps.is_available():
        states["mps"] = torch.mps.get_rng_state()
    return states


# Any: the generator states as read back from a file; each generator's setter checks its own.
def _restore_local(states: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    modules = dict(_device_modules())
    for name, value in states.items():
        if name in modules:
            modules[name].set_rng_state_all(value)
        elif name == "mps" and torch.backends.mps.is_available():
            torch.mps.set_rng_state(value)


def capture_rng_states() -> dict[str, object]:
    """Return this process's generator states as a structure ``torch.load(weights_only=True)`` reads.

    Returns:
        ``{"source": "shared" | "local", "states": ...}``.
    """
    helpers = _shared_helpers()
    if helpers is not None:
        return {"source": "shared", "states": _to_plain(helpers[0]())}
    return {"source": "local", "states": _to_plain(_capture_local())}


def restore_rng_states(payload: Mapping[str, object]) -> None:
    """Put back generator states captured by :func:`capture_rng_states`.

    Args:
        payload: What :func:`capture_rng_states` returned (possibly through a save and load).

    Raises:
        ValueError: If the payload was captured by a helper this installation does not have.
        TypeError: If the payload's local generator states are not a dict.
    """
    states = _from_plain(payload["states"])
    if payload.get("source") == "shared":
        helpers = _shared_helpers()
        if helpers is None:
            raise ValueError(
                "These random states were captured with accelerando.common.random.get_rng_states, which "
                "this installation lacks; load the checkpoint with the accelerando version that wrote it."
            )
        helpers[1](states)
        return
    if not isinstance(states, dict):
        raise TypeError(f"The saved random states must be a dict, got {type(states).__name__}.")
    _restore_local(states)
