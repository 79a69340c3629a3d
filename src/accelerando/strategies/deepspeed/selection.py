"""Which DeepSpeed plugin is active: several named plugins can serve several models.

The selection is state the ``AcceleratorState`` view keeps, so the functions live in
:mod:`accelerando.state`; they are re-exported here for the strategy.
"""

from __future__ import annotations

from accelerando.state import get_active_deepspeed_plugin, select_deepspeed_plugin

__all__ = ["get_active_deepspeed_plugin", "select_deepspeed_plugin"]
