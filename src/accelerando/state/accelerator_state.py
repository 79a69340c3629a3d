"""AcceleratorState: what the newest Accelerator decided, as a read-only view over the Runtime."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import accelerando.core.runtime as runtime
from accelerando.core.enums import DistributedType
from accelerando.state.partial import _STATE_KEYS, PartialState
from accelerando.state.shared import fork_launched, missing_attribute, view_is_read_only

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

_T = TypeVar("_T")

__all__ = ["AcceleratorState", "get_active_deepspeed_plugin", "select_deepspeed_plugin"]

# Present in the shared dict from construction until ``_reset_state()``: whether the view is live.
_LIVE_KEY = "active_deepspeed_plugin_name"
# The reference's keys of what the Accelerator decided (plus the process facts, _STATE_KEYS): after a
# reset, reading one of these names says that the state was reset.
_DECISION_KEYS = frozenset(
    {
        "_mixed_precision",
        "deepspeed_plugins",
        "device_mesh",
        "distributed_type",
        "dynamo_plugin",
        "fsdp_plugin",
        "megatron_lm_plugin",
        "parallelism_config",
        "torch_tp_plugin",
    }
)


class AcceleratorState:
    """What the newest Accelerator decided, on top of ``PartialState``; a read-only view.

    Reads the process's :class:`~accelerando.core.runtime.Runtime`: ``mixed_precision``,
    ``distributed_type`` (possibly FSDP, DEEPSPEED, MEGATRON_LM), ``deepspeed_plugins``,
    ``fsdp_plugin``, ``megatron_lm_plugin``, ``dynamo_plugin``, ``torch_tp_plugin``,
    ``parallelism_config``, ``device_mesh``. Before any Accelerator exists these are the process's
    defaults (``"no"`` precision, the plain data-parallel type, no plugins). Unknown attributes are
    read from ``PartialState``. The only thing written through it is the active DeepSpeed plugin
    (:meth:`select_deepspeed_plugin`).

    Args:
        mixed_precision, dynamo_plugin, deepspeed_plugin, fsdp_plugin, torch_tp_plugin,
            megatron_lm_plugin, parallelism_config: the reference's settings. The view cannot be
            configured: each must be None or what is already in effect.
        cpu: passed to ``PartialState`` when the process state does not exist yet.
        _from_accelerator: accepted for compatibility (the Accelerator configures the runtime itself).
        **kwargs: ``pg_kwargs`` (process-group options for ``PartialState``); anything else is refused.

    Raises:
        TypeError: a setting that differs from what is in effect, or an unknown keyword.
    """

    _shared_state: dict[str, object] = {}
    _view_names = frozenset(
        {
            "mixed_precision",
            "distributed_type",
            "deepspeed_plugins",
            "fsdp_plugin",
            "megatron_lm_plugin",
            "dynamo_plugin",
            "torch_tp_plugin",
            "parallelism_config",
            "device_mesh",
        }
    )

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: object = None,
        deepspeed_plugin: object = None,
        fsdp_plugin: object = None,
        torch_tp_plugin: object = None,
        megatron_lm_plugin: object = None,
        parallelism_config: object = None,
        _from_accelerator: bool = False,
        **kwargs: Mapping[str, object] | None,
    ) -> None:
        pg_kwargs = kwargs.pop("pg_kwargs", None)
        if kwargs:
            raise TypeError(
                f"AcceleratorState() takes no settings ({', '.join(sorted(kwargs))}); pass them to Accelerator(...)"
            )
        self.__dict__ = self._shared_state
        self._shared_state.setdefault(_LIVE_KEY, None)
        # Always constructed (cheap once the process exists): it also fills PartialState's shared dict
        # when the Accelerator's connector started the process.
        PartialState(cpu=cpu, **(pg_kwargs or {}))
        given = {
            "mixed_precision": mixed_precision,
            "dynamo_plugin": dynamo_plugin,
            "deepspeed_plugin": deepspeed_plugin,
            "fsdp_plugin": fsdp_plugin,
            "torch_tp_plugin": torch_tp_plugin,
            "megatron_lm_plugin": megatron_lm_plugin,
            "parallelism_config": parallelism_config,
        }
        differing = [
            name for name, value in given.items() if value is not None and not self._holds(name, value)
        ]
        if differing:
            raise TypeError(
                f"AcceleratorState() is a view of what the Accelerator decided and cannot set "
                f"{', '.join(differing)}; pass them to Accelerator(...)"
            )

    def _holds(self, name: str, value: object) -> bool:
        """Whether the view already holds ``value`` for the setting ``name``."""
        if name == "mixed_precision":
            return str(value) == self.mixed_precision
        if name == "deepspeed_plugin":
            plugins = self.deepspeed_plugins or {}
            candidates = value.values() if isinstance(value, dict) else [value]
            return all(any(c is p for p in plugins.values()) for c in candidates)
        return getattr(self, name) is value

    def __setattr__(self, name: str, value: object) -> None:
        if name in self._view_names:
            if getattr(self, name) is value:  # re-stating what the runtime holds changes nothing
                return
            raise view_is_read_only(type(self).__name__, name)
        super().__setattr__(name, value)

    @property
    def _partial(self) -> PartialState:
        self._require_live()
        return PartialState()

    def _require_live(self) -> None:
        # After ``_reset_state()`` the view is empty until constructed again; the AttributeError makes
        # Python ask ``__getattr__``, which names the attribute asked for.
        if _LIVE_KEY not in self._shared_state:
            raise AttributeError("_reset_state")

    def _runtime(self) -> runtime.Runtime | None:
        self._require_live()
        return runtime.current()

    @property
    def initialized(self) -> bool:
        """Whether an Accelerator has configured the state in this process."""
        return runtime.current() is not None

    @property
    def mixed_precision(self) -> str:
        """The mixed-precision mode in effect (``"no"`` before any Accelerator)."""
        current = self._runtime()
        return "no" if current is None else current.settings.mixed_precision

    @property
    def distributed_type(self) -> DistributedType:
        """How processes cooperate, as the Accelerator decided (the process's type before one)."""
        current = self._runtime()
        return self._partial.distributed_type if current is None else current.distributed_type

    @property
    def deepspeed_plugins(self) -> dict[str, Any] | None:
        """Name -> DeepSpeed plugin (None without DeepSpeed)."""
        return self._plugin("deepspeed")

    @property
    def fsdp_plugin(self) -> Any:
        """The FSDP plugin (None without FSDP)."""
        return self._plugin("fsdp")

    @property
    def megatron_lm_plugin(self) -> Any:
        """The Megatron-LM plugin (None without Megatron-LM)."""
        return self._plugin("megatron_lm")

    @property
    def dynamo_plugin(self) -> Any:
        """The torch.compile plugin (None before any Accelerator)."""
        return self._plugin("dynamo")

    @property
    def torch_tp_plugin(self) -> Any:
        """The tensor-parallel plugin (None without one)."""
        return self._plugin("torch_tp")

    @property
    def parallelism_config(self) -> Any:
        """The ParallelismConfig (None without one)."""
        return self._plugin("parallelism_config")

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The DeviceMesh built from the ParallelismConfig (None without one)."""
        current = self._runtime()
        return None if current is None else current.mesh

    # The plugin classes live in layers above this one (plugins/), so the views below name them Any.
    def _plugin(self, name: str) -> Any:
        current = self._runtime()
        return None if current is None else getattr(current.plugins, name)

    @property
    def deepspeed_plugin(self) -> Any:
        """The active DeepSpeed plugin (None without DeepSpeed)."""
        plugins = self.deepspeed_plugins
        if not plugins:
            return None
        return plugins[self.active_deepspeed_plugin_name or next(iter(plugins))]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the DeepSpeed plugin registered as ``name`` the active one (several-model setups).

        Raises:
            ValueError: no plugin of that name (the known names are listed).
        """
        select_deepspeed_plugin(self, name)

    # ------------------------------------------------------ process queries
    # The reference's AcceleratorState answers these itself; here they read the process view.
    @property
    def use_distributed(self) -> bool:
        """True when several processes cooperate."""
        return self._partial.use_distributed

    @property
    def is_main_process(self) -> bool:
        """True on the process of global index 0."""
        return self._partial.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """True on the first process of each machine."""
        return self._partial.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        """True on the process of the highest global index."""
        return self._partial.is_last_process

    @property
    def fork_launched(self) -> bool:
        """Whether the processes were started by forking (the notebook launcher sets ``FORK_LAUNCHED``)."""
        self._require_live()
        return fork_launched()

    @property
    def is_fsdp2(self) -> bool:
        """Whether FSDP version 2 (``fully_shard``) is in use."""
        plugin = self.fsdp_plugin
        # An FSDP plugin is only in the runtime when the connector chose the FSDP strategy.
        return plugin is not None and getattr(plugin, "fsdp_version", 1) == 2

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (no-op in a single process)."""
        self._partial.wait_for_everyone()

    # Any: print's own keywords (sep, end, file, flush), passed on as given.
    def print(self, *args: object, **kwargs: Any) -> None:
        """``print`` on each machine's first process only."""
        self._partial.print(*args, **kwargs)

    def split_between_processes(
        self, inputs: _T, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[_T]:
        """Context manager yielding this process's share of ``inputs`` (see ``PartialState``)."""
        return self._partial.split_between_processes(inputs, apply_padding=apply_padding)

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context manager: the main process runs the block first, the others after it."""
        return self._partial.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context manager: each machine's first process runs the block first, the others after it."""
        return self._partial.local_main_process_first()

    def destroy_process_group(self, group: ProcessGroup | None = None) -> None:
        """Tear down the process group (the default one when ``group`` is None); see ``PartialState``."""
        self._partial.destroy_process_group(group)

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The DeepSpeed plugin registered as ``name``.

        Raises:
            ValueError: DeepSpeed is not in use, or no plugin has that name (the names are listed).
        """
        plugins = self.deepspeed_plugins
        if not plugins:
            raise _deepspeed_not_enabled()
        if name not in plugins:
            raise ValueError(f"no DeepSpeed plugin named {name!r}; the plugins are {list(plugins)}")
        return plugins[name]

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not found normally (or whose property raised AttributeError):
        # the process facts come from PartialState; after a reset the error says the state was reset.
        owner = type(self).__name__
        if name.startswith("__"):
            raise AttributeError(name)
        if _LIVE_KEY not in self._shared_state:
            known = name in _STATE_KEYS or name in _DECISION_KEYS
            raise missing_attribute(owner, name, after_reset=known)
        try:
            return getattr(PartialState(), name)
        except AttributeError as error:
            if "_reset_state()" in str(error):
                raise
            raise missing_attribute(owner, name, after_reset=False) from None

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """Forget the Accelerator's decisions (and the process state when asked).

        Until the next ``AcceleratorState()`` or ``Accelerator()``, reading the state's attributes from
        an existing instance (``accelerator.state``) raises ``AttributeError`` saying so.
        """
        cls._shared_state.clear()
        runtime.forget(keep_process=not reset_partial_state)
        if reset_partial_state:
            PartialState._reset_state()

    def __repr__(self) -> str:
        return (
            repr(self._partial).replace(
                f"Distributed environment: {self._partial.distributed_type}",
                f"Distributed environment: {self.distributed_type}",
            )
            + f"Mixed precision type: {self.mixed_precision}\n"
        )


# Which DeepSpeed plugin is active is the one piece of state the AcceleratorState view holds itself;
# the strategy and ``accelerando.utils.deepspeed`` re-export these two functions.
def _deepspeed_not_enabled() -> ValueError:
    return ValueError(
        "DeepSpeed is not enabled: pass Accelerator(deepspeed_plugin=...) or deepspeed_plugins={...}, "
        "or launch with --use_deepspeed"
    )


def get_active_deepspeed_plugin(state: object) -> Any:
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
        raise _deepspeed_not_enabled()
    name = getattr(state, "active_deepspeed_plugin_name", None)
    return plugins[name] if name is not None else next(iter(plugins.values()))


def select_deepspeed_plugin(state: AcceleratorState, name: str | None = None) -> Any:
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
        raise _deepspeed_not_enabled()
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
