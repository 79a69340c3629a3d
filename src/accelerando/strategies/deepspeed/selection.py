"""Which DeepSpeed plugin is active: several named plugins can serve several models.

Imports nothing from accelerando, so ``AcceleratorState.select_deepspeed_plugin`` can use it without
a cycle through the strategy (whose wrappers build on the optimizer and scheduler modules).
"""

from __future__ import annotations

from typing import Any

__all__ = ["get_active_deepspeed_plugin", "select_deepspeed_plugin"]


def get_active_deepspeed_plugin(state: Any) -> Any:
    """Return the DeepSpeed plugin currently selected in ``state`` (an ``AcceleratorState``).

    Args:
        state: the accelerator state holding ``deepspeed_plugins``.

    Returns:
        The active ``DeepSpeedPlugin``.

    Raises:
        ValueError: DeepSpeed is not in use (no plugin was given).
    """
    plugins = getattr(state, "deepspeed_plugins", None)
    if not plugins:
        raise ValueError(
            "DeepSpeed is not enabled: pass Accelerator(deepspeed_plugin=...) or deepspeed_plugins={...}, "
            "or launch with --use_deepspeed"
        )
    name = getattr(state, "active_deepspeed_plugin_name", None)
    return plugins[name] if name is not None else next(iter(plugins.values()))


def select_deepspeed_plugin(state: Any, name: str | None = None) -> Any:
    """Make the plugin called ``name`` the active one (the next ``prepare`` uses its config).

    Args:
        state: the accelerator state holding ``deepspeed_plugins``.
        name: a key of ``deepspeed_plugins``; None selects the first one.

    Returns:
        The selected plugin.

    Raises:
        ValueError: DeepSpeed is not in use, or no plugin has that name (the message lists the names).
    """
    plugins = getattr(state, "deepspeed_plugins", None)
    if not plugins:
        get_active_deepspeed_plugin(state)  # raises the "not enabled" error
    if name is None:
        name = next(iter(plugins))
    if name not in plugins:
        raise ValueError(f"no DeepSpeed plugin named {name!r}; the plugins are {list(plugins)}")
    for key, plugin in plugins.items():
        if key != name:
            plugin.selected = False
    plugins[name].select(_from_accelerator_state=True)
    state.active_deepspeed_plugin_name = name
    return plugins[name]
