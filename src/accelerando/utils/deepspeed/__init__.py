"""DeepSpeed helpers: plugin lookup, placeholders, wrappers, "auto" config filling, automatic ZeRO choice.

Nothing here imports ``deepspeed``; the strategy (``accelerando.strategies.deepspeed``) does, when used.
"""

from __future__ import annotations

from accelerando.utils.deepspeed.auto_stage import ZeroChoice, choose_zero_config, estimate_zero_memory
from accelerando.utils.deepspeed.config import (
    auto_keys,
    fill_auto,
    get_value,
    load_config,
    require_no_auto,
    set_value,
)
from accelerando.utils.deepspeed.wrappers import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
    get_active_deepspeed_plugin,
    select_deepspeed_plugin,
)

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "ZeroChoice",
    "auto_keys",
    "choose_zero_config",
    "estimate_zero_memory",
    "fill_auto",
    "get_active_deepspeed_plugin",
    "get_value",
    "load_config",
    "require_no_auto",
    "select_deepspeed_plugin",
    "set_value",
]
