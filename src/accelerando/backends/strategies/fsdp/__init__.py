"""Fully Sharded Data Parallel strategy (FSDP2 ``fully_shard`` first, FSDP1 for existing configs).

``strategy.py`` holds the strategy, ``wrap.py`` how models are sharded, ``state.py`` their full and
sharded state dicts, ``auto.py`` the automatic sharding choice, ``helpers.py`` the public helpers
(``fsdp2_prepare_model``, ``merge_fsdp_weights``, ...) re-exported at ``accelerando.backends.strategies.fsdp.checkpoint``.
"""

from __future__ import annotations

from accelerando.backends.strategies.fsdp.strategy import FSDPStrategy

__all__ = ["FSDPStrategy"]
