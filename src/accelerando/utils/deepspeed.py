"""DeepSpeed names at the reference's ``accelerate.utils.deepspeed`` path (re-exports only).

The strategy's pieces live in :mod:`accelerando.backends.strategies.deepspeed`; the queryable config object
:class:`HfDeepSpeedConfig` lives with the plugin (:mod:`accelerando.plugins.hf_deepspeed_config`).
Importing this module does not import ``deepspeed``.
"""

from __future__ import annotations

from accelerando.backends.strategies.deepspeed.auto_stage import (
    ZeroChoice,
    choose_zero_config,
    estimate_zero_memory,
)
from accelerando.backends.strategies.deepspeed.config import (
    auto_keys,
    fill_auto,
    get_value,
    load_config,
    require_no_auto,
    set_value,
)
from accelerando.backends.strategies.deepspeed.optim_map import map_pytorch_optim_to_deepspeed
from accelerando.backends.strategies.deepspeed.selection import (
    get_active_deepspeed_plugin,
    select_deepspeed_plugin,
)
from accelerando.backends.strategies.deepspeed.wrappers import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
)
from accelerando.plugins.hf_deepspeed_config import HfDeepSpeedConfig

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "ZeroChoice",
    "auto_keys",
    "choose_zero_config",
    "estimate_zero_memory",
    "fill_auto",
    "get_active_deepspeed_plugin",
    "get_value",
    "load_config",
    "map_pytorch_optim_to_deepspeed",
    "require_no_auto",
    "select_deepspeed_plugin",
    "set_value",
]
