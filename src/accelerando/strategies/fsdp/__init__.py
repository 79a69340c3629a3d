"""Fully Sharded Data Parallel strategy (FSDP2 ``fully_shard`` first, FSDP1 for existing configs).

``strategy.py`` holds the strategy, ``wrap.py`` how models are sharded, ``state.py`` their full and
sharded state dicts.
"""

from __future__ import annotations

from accelerando.strategies.fsdp.strategy import FSDPStrategy

__all__ = ["FSDPStrategy"]
