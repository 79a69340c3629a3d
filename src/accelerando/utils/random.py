"""The reference's import path ``accelerate.utils.random``.

Re-exports from :mod:`accelerando.common.random`.
"""

from __future__ import annotations

from accelerando.common.random import (
    CUDA_DISTRIBUTED_TYPES,
    get_rng_states,
    set_rng_states,
    set_seed,
    synchronize_rng_state,
    synchronize_rng_states,
)

__all__ = [
    "CUDA_DISTRIBUTED_TYPES",
    "get_rng_states",
    "set_rng_states",
    "set_seed",
    "synchronize_rng_state",
    "synchronize_rng_states",
]
