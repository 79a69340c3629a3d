"""FSDP names at the reference's ``accelerate.utils.fsdp`` path.

Everything of FSDP lives in :mod:`accelerando.strategies.fsdp` and is re-exported here; only the two
RAM-efficient-loading switches are defined here, because they write environment variables (the
interface ``transformers`` reads) and this module is where the design rules allow that.
"""

from __future__ import annotations

import os

from accelerando.strategies.fsdp.auto import (
    ShardingChoice,
    choose_sharding_strategy,
    estimate_sharding_memory,
)
from accelerando.strategies.fsdp.helpers import (
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    load_sharded_checkpoint,
    merge_fsdp_weights,
)

__all__ = [
    "ShardingChoice",
    "choose_sharding_strategy",
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "estimate_sharding_memory",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model",
    "load_sharded_checkpoint",
    "merge_fsdp_weights",
]

# The variables transformers' ``from_pretrained`` reads to decide whether only rank 0 materialises
# weights; both the reference's names and ours are set so either reader sees the switch.
_RAM_EFFICIENT_VARS = ("FSDP_CPU_RAM_EFFICIENT_LOADING", "ACCELERANDO_FSDP_CPU_RAM_EFFICIENT_LOADING")
_USE_FSDP_VARS = ("ACCELERATE_USE_FSDP", "ACCELERANDO_USE_FSDP")


def enable_fsdp_ram_efficient_loading() -> None:
    """Make transformers' ``from_pretrained`` load weights on rank 0 only (others get empty weights).

    Sets the FSDP RAM-efficient-loading environment switch (and the FSDP switch when unset) that
    ``transformers`` reads; the strategy then broadcasts rank 0's weights when it wraps the model.
    Writing the environment is the point of this function: it is the interface transformers reads.
    """
    for name in _USE_FSDP_VARS:
        os.environ.setdefault(name, "true")
    for name in _RAM_EFFICIENT_VARS:
        os.environ[name] = "true"


def disable_fsdp_ram_efficient_loading() -> None:
    """Undo :func:`enable_fsdp_ram_efficient_loading`: every rank loads full weights again."""
    for name in _RAM_EFFICIENT_VARS:
        os.environ[name] = "false"
