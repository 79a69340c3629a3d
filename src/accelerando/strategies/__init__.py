"""Strategies: how models are wrapped and processes cooperate. One line per backend in STRATEGIES.

A strategy module is imported only when the connector picks it, so unused backends (and their
libraries) never load.
"""

from __future__ import annotations

import importlib

from accelerando.strategies.base import Strategy

__all__ = ["STRATEGIES", "Strategy", "strategy_class"]

STRATEGIES: dict[str, str] = {
    "single": "accelerando.strategies.base:Strategy",
    "ddp": "accelerando.strategies.ddp:DDPStrategy",
    "fsdp": "accelerando.strategies.fsdp:FSDPStrategy",
    "deepspeed": "accelerando.strategies.deepspeed:DeepSpeedStrategy",
    "megatron": "accelerando.strategies.megatron:MegatronStrategy",
}


def strategy_class(name: str) -> type[Strategy]:
    """Import and return the strategy class registered as ``name``.

    Raises:
        ValueError: no strategy of that name.
        NotImplementedError: the strategy is registered but its module is not available yet.
    """
    target = STRATEGIES.get(name)
    if target is None:
        raise ValueError(f"unknown strategy {name!r}; known: {sorted(STRATEGIES)}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise NotImplementedError(
                f"the {name!r} strategy is not available in this version of accelerando"
            ) from exc
        raise
    return getattr(module, attr)
