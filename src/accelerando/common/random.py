"""Seeding and random-number-generator state: set, synchronise across processes, capture, restore.

RNG names accepted everywhere (as strings or :class:`~accelerando.core.enums.RNGType`): ``"python"``,
``"numpy"``, ``"torch"`` (the CPU generator), ``"generator"`` (a ``torch.Generator`` you pass) and the
accelerator families ``"cuda"``, ``"xpu"``, ``"npu"``, ``"mlu"``, ``"musa"``, ``"sdaa"``, ``"hpu"``,
``"mps"``. An accelerator family that is not present on this machine is skipped, so a script written
for GPUs (``synchronize_rng_states(["torch", "cuda", "numpy"])``) also runs on a CPU-only machine.
"""

from __future__ import annotations

import logging
import random as _py_random
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import torch

from accelerando.common.constants import CUDA_DISTRIBUTED_TYPES
from accelerando.common.imports import is_cuda_available, is_mps_available, is_npu_available
from accelerando.common.operations import broadcast_object_list
from accelerando.core.enums_on_demand import RNGType
from accelerando.state import PartialState

__all__ = [
    "CUDA_DISTRIBUTED_TYPES",
    "get_rng_states",
    "set_rng_states",
    "set_seed",
    "synchronize_rng_state",
    "synchronize_rng_states",
]

# The reference logs this code under its utils path; scripts and tests listen there.
logger = logging.getLogger("accelerando.utils.random")

# Accelerator families whose torch module (torch.<name>) exposes the per-device RNG API
# (is_available, device_count, get_rng_state, set_rng_state, manual_seed_all).
_DEVICE_FAMILIES = ("cuda", "xpu", "npu", "mlu", "musa", "sdaa", "hpu")
_HOST_TYPES = ("python", "numpy", "torch", "generator")
_ACCEPTED = (*_HOST_TYPES, *_DEVICE_FAMILIES, "mps", "xla")


def _numpy() -> ModuleType | None:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _device_module(family: str) -> ModuleType | None:
    """Return ``torch.<family>`` when that accelerator is present, without initialising others."""
    if family == "cuda":
        return torch.cuda if is_cuda_available() else None
    if family == "npu":
        if not is_npu_available(check_device=True):
            return None
    module = getattr(torch, family, None)
    if module is None or not hasattr(module, "get_rng_state"):
        return None
    try:
        return module if module.is_available() else None
    except (RuntimeError, AttributeError):
        return None


def _mps_available() -> bool:

    return is_mps_available()


def _normalise(rng_type: str | RNGType | None) -> str:
    if rng_type is None:
        return "torch"
    name = str(rng_type.value if isinstance(rng_type, RNGType) else rng_type).strip().lower()
    if name not in _ACCEPTED:
        raise ValueError(f"Unknown RNG type {rng_type!r}; use one of {', '.join(_ACCEPTED)}.")
    return name


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy, torch and every present accelerator for reproducible runs.

    Args:
        seed: the seed.
        device_specific: add the process index to the seed, so each process draws different numbers
            (e.g. for data augmentation) while the run stays reproducible.
        deterministic: also ask torch to use deterministic algorithms only
            (``torch.use_deterministic_algorithms(True)``); slower, and some ops then raise.

    Raises:
        TypeError: if ``seed`` is not an integer.

    Example:
        >>> import torch
        >>> from accelerando.utils import set_seed
        >>> set_seed(42)
        >>> first = torch.rand(2)
        >>> set_seed(42)
        >>> torch.equal(first, torch.rand(2))
        True
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}; e.g. set_seed(42).")
    if device_specific:
        seed += PartialState().process_index
    _py_random.seed(seed)
    np = _numpy()
    if np is not None:
        # numpy's legacy global generator only takes seeds in [0, 2**32).
        np.random.seed(seed % (2**32))
    # torch.manual_seed also seeds CUDA lazily (without initialising it) when torch has CUDA.
    torch.manual_seed(seed)
    for family in _DEVICE_FAMILIES:
        if family == "cuda":
            continue
        module = _device_module(family)
        if module is not None and hasattr(module, "manual_seed_all"):
            module.manual_seed_all(seed)
    if _mps_available():
        torch.mps.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _read_state(name: str, generator: torch.Generator | None) -> object:
    if name == "python":
        return _py_random.getstate()
    if name == "numpy":
        np = _numpy()
        return None if np is None else np.random.get_state()
    if name == "torch":
        return torch.get_rng_state()
    if name == "generator":
        return generator.get_state()  # type: ignore[union-attr]
    if name == "mps":
        return torch.mps.get_rng_state() if _mps_available() else None
    if name == "xla":
        return None
    module = _device_module(name)
    return None if module is None else module.get_rng_state()


# ``state`` comes from the main process over the wire: whatever that generator's getstate gave.
def _write_state(name: str, state: Any, generator: torch.Generator | None) -> None:
    if name == "python":
        _py_random.setstate(state)
    elif name == "numpy":
        _numpy().random.set_state(state)  # type: ignore[union-attr]
    elif name == "torch":
        torch.set_rng_state(state)
    elif name == "generator":
        generator.set_state(state)  # type: ignore[union-attr]
    elif name == "mps":
        torch.mps.set_rng_state(state)
    else:
        _device_module(name).set_rng_state(state)  # type: ignore[union-attr]


def synchronize_rng_state(
    rng_type: str | RNGType | None = None, generator: torch.Generator | None = None
) -> None:
    """Give every process the RNG state of the main process for one generator.

    Args:
        rng_type: which generator (see the module docstring); ``None`` means ``"torch"``. An
            accelerator family absent from this machine is skipped.
        generator: the generator to synchronise when ``rng_type`` is ``"generator"``.

    Raises:
        ValueError: if ``rng_type`` is unknown, or ``"generator"`` is asked without a generator.
    """
    name = _normalise(rng_type)
    if name == "generator" and generator is None:
        raise ValueError(
            "synchronize_rng_state('generator') needs the torch.Generator to synchronise: pass generator=..."
        )
    if name == "xla":
        logger.warning("Synchronising the XLA RNG is not supported by accelerando; skipped.")
        return

    state = PartialState()
    if not state.use_distributed:
        return
    local = _read_state(name, generator)
    # Every process takes part in the broadcast, even one without this device, to stay in step.
    payload = [local if state.is_main_process else None]

    broadcast_object_list(payload, from_process=0)
    if payload[0] is not None and local is not None and not state.is_main_process:
        _write_state(name, payload[0], generator)


def synchronize_rng_states(
    rng_types: Iterable[str | RNGType] | None = None, generator: torch.Generator | None = None
) -> None:
    """Give every process the main process's RNG state for each generator in ``rng_types``.

    Args:
        rng_types: which generators (see the module docstring). ``None`` means ``"torch"`` plus the
            accelerator family in use, if any.
        generator: the ``torch.Generator`` to synchronise when ``"generator"`` is listed.

    Raises:
        ValueError: if a type is unknown, or ``"generator"`` is listed without a generator.

    Example:
        >>> from accelerando import synchronize_rng_states
        >>> synchronize_rng_states(["torch"])  # every process now draws what the main process draws
    """
    if rng_types is None:
        rng_types = ["torch", *[f for f in _DEVICE_FAMILIES if _device_module(f) is not None][:1]]
    if isinstance(rng_types, (str, RNGType)):
        rng_types = [rng_types]
    names = [_normalise(t) for t in rng_types]
    for name in names:
        synchronize_rng_state(name, generator=generator)


def get_rng_states() -> dict[str, object]:
    """Capture the state of every global random number generator of this process.

    Includes Python's ``random``, NumPy's global generator (if NumPy is installed), torch's CPU
    generator and, for each accelerator family present and already initialised in this process,
    the list of its per-device states.

    Returns:
        A picklable dict, to be given back to :func:`set_rng_states` (e.g. saved in a checkpoint).
    """
    states: dict[str, object] = {"python": _py_random.getstate(), "torch": torch.get_rng_state()}
    np = _numpy()
    if np is not None:
        states["numpy"] = np.random.get_state()
    for family in _DEVICE_FAMILIES:
        module = _device_module(family)
        # A family this process never initialised has not drawn numbers; reading its state would
        # initialise it (and, for CUDA, forbid forking afterwards), so it is left out.
        is_initialized = getattr(module, "is_initialized", None)
        if module is not None and (not callable(is_initialized) or is_initialized()):
            states[family] = [module.get_rng_state(i) for i in range(module.device_count())]
    if _mps_available():
        states["mps"] = torch.mps.get_rng_state()
    return states


# ``states`` is read back from a checkpoint: each value has the type its generator's getstate gives.
def set_rng_states(states: dict[str, Any]) -> None:
    """Restore generator states captured by :func:`get_rng_states`.

    States of accelerators absent here are skipped with a warning (a GPU checkpoint resumed on CPU);
    with fewer devices than were saved, the first ones are restored.

    Args:
        states: the dict returned by :func:`get_rng_states`.

    Raises:
        TypeError: if ``states`` is not a dict.
    """
    if not isinstance(states, dict):
        raise TypeError(
            f"set_rng_states expects the dict from get_rng_states(), got {type(states).__name__}."
        )
    if "python" in states:
        _py_random.setstate(states["python"])
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    np = _numpy()
    if "numpy" in states and np is not None:
        np.random.set_state(states["numpy"])
    for family in _DEVICE_FAMILIES:
        if family not in states:
            continue
        module = _device_module(family)
        if module is None:
            logger.warning("Saved %s RNG states ignored: no %s device here.", family, family)
            continue
        for index, device_state in enumerate(states[family][: module.device_count()]):
            module.set_rng_state(device_state, index)
    if "mps" in states and _mps_available():
        torch.mps.set_rng_state(states["mps"])
