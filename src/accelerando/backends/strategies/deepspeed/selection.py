"""Which DeepSpeed plugin is active: several named plugins can serve several models.

The selection is made through the ``AcceleratorState`` view (``select_deepspeed_plugin``, in
:mod:`accelerando.state`, re-exported here), which marks the chosen plugin ``selected``. The
strategy reads the mark on the plugins of its runtime (:func:`active_plugin`), not global state.
"""

from __future__ import annotations

from collections.abc import Mapping

from accelerando.plugins.deepspeed import DeepSpeedPlugin
from accelerando.state import get_active_deepspeed_plugin, select_deepspeed_plugin

__all__ = ["active_plugin", "get_active_deepspeed_plugin", "select_deepspeed_plugin"]


def active_plugin(plugins: Mapping[str, DeepSpeedPlugin] | None) -> DeepSpeedPlugin:
    """The plugin marked ``selected`` among ``plugins``, else the first one (none selected yet).

    Raises:
        ValueError: DeepSpeed is not in use (no plugin was given).
    """
    if not plugins:
        raise ValueError(
            "DeepSpeed is not enabled: pass Accelerator(deepspeed_plugin=...) or deepspeed_plugins={...}, "
            "or launch with --use_deepspeed"
        )
    return next((plugin for plugin in plugins.values() if plugin.selected), next(iter(plugins.values())))
