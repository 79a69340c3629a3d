"""Capture and restore every random number generator of this process, in a weights-only-safe form.

``accelerando.common.random.get_rng_states`` / ``set_rng_states`` are used when that module provides
them; otherwise the generators are captured here: Python ``random``, NumPy's global generator,
torch's CPU generator and each initialised accelerator's generators (CUDA, XPU, MPS, NPU, ...).
"""

from __future__ import annotations

import array
import hashlib
import random
import sys
from typing import TYPE_CHECKING, Any, cast

import torch

from accelerando.common import random as shared_random

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType

__all__ = ["capture_rng_states", "derived_seed", "restore_rng_states"]

_NDARRAY_TAG = "__ndarray__"  # a NumPy array as a list (files written before the packed form)
_PACKED_ARRAY_TAG = "__ndarray_bytes__"  # a NumPy array as its bytes, dtype and shape
_PACKED_INTS_TAG = "__uint64_le__"  # a long tuple or list of ints in [0, 2**64) as little-endian bytes
# Sequences of ints at least this long are packed: pickling costs a call per object (torch.save's
# persistent_id), about 1,250 for Python's and NumPy's Mersenne Twister states otherwise.
_PACK_MIN_INTS = 32


def _packed_ints(value: list[object] | tuple[object, ...]) -> dict[str, object] | None:
    """``value`` (a long sequence of plain ints in [0, 2**64)) packed into bytes, else None."""
    # Plain ints only (not bools or NumPy integers, which would come back as ints); the array refuses
    # negative ones and those of 2**64 and above.
    if len(value) < _PACK_MIN_INTS or set(map(type, value)) != {int}:
        return None
    try:
        data = array.array("Q", cast("list[int]", value))
    except OverflowError:
        return None
    if sys.byteorder != "little":
        data.byteswap()
    return {_PACKED_INTS_TAG: data.tobytes(), "kind": "tuple" if isinstance(value, tuple) else "list"}


def _to_plain(value: object) -> object:
    """Turn NumPy arrays and long int sequences inside a nested structure into plain, compact data
    (bytes in tagged dicts, loadable with weights_only; one pickled object each).
    """
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biuf" and not value.dtype.hasobject:
            data = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<"), copy=False)
            return {_PACKED_ARRAY_TAG: data.tobytes(), "dtype": str(value.dtype), "shape": list(value.shape)}
        return {_NDARRAY_TAG: value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        packed = _packed_ints(value)
        if packed is not None:
            return packed
        if all(type(v) is int for v in value):  # short: nothing to convert
            return value
        return type(value)(_to_plain(v) for v in value)
    return value


def _from_packed(value: dict[str, Any]) -> object:
    """The NumPy array or int sequence of a tagged dict written by :func:`_to_plain`."""
    import numpy as np

    if _NDARRAY_TAG in value:
        return np.asarray(value[_NDARRAY_TAG], dtype=value["dtype"])
    if _PACKED_ARRAY_TAG in value:
        dtype = np.dtype(value["dtype"])
        data = np.frombuffer(value[_PACKED_ARRAY_TAG], dtype=dtype.newbyteorder("<"))
        return data.astype(dtype).reshape(value["shape"])  # a writable copy, in this machine's order
    data = array.array("Q")
    data.frombytes(value[_PACKED_INTS_TAG])
    if sys.byteorder != "little":
        data.byteswap()
    return tuple(data) if value.get("kind") == "tuple" else list(data)


def _from_plain(value: object) -> object:
    """Inverse of :func:`_to_plain` (reads the list form of arrays of earlier files too)."""
    if isinstance(value, dict):
        if _NDARRAY_TAG in value or _PACKED_ARRAY_TAG in value or _PACKED_INTS_TAG in value:
            return _from_packed(value)
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


def derived_seed(payload: Mapping[str, object], rank: int) -> int:
    """The seed of a process that did not exist in the run that saved (a resume on more processes).

    The rule (documented in the guide on changing the number of processes): process ``rank`` of the
    resumed run, with ``rank >= N`` saved processes, first restores the states of saved process
    ``rank % N`` (``payload``), then seeds every generator with the first 8 bytes (little-endian) of
    SHA-256 over ``b"accelerando-elastic-rng"``, that process's torch CPU generator state and
    ``rank`` as 8 little-endian bytes. So the same checkpoint gives the same streams on every resume,
    and no two processes draw the same numbers.

    Args:
        payload: what :func:`capture_rng_states` returned in saved process ``rank % N``.
        rank: this process's index in the resumed run.

    Returns:
        A seed in ``[0, 2**63)``.
    """
    states = _from_plain(payload.get("states"))
    torch_state = states.get("torch") if isinstance(states, dict) else None
    digest = hashlib.sha256(b"accelerando-elastic-rng")
    if isinstance(torch_state, torch.Tensor):
        digest.update(torch_state.contiguous().view(torch.uint8).numpy().tobytes())
    digest.update(int(rank).to_bytes(8, "little"))
    return int.from_bytes(digest.digest()[:8], "little") >> 1
