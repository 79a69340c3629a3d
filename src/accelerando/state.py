"""Process state: who am I, how many of us are there, which device do I use.

``PartialState`` and ``AcceleratorState`` keep the reference's names and attributes but hold no
decisions of their own: they are read-only views over the process's Runtime
(:mod:`accelerando.runtime`), which the connector builds. Every instance shares one dictionary (the
Borg pattern), so ``PartialState()`` anywhere is the same object. ``GradientState`` tracks
accumulation and dataloader progress.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

import accelerando.runtime as runtime
from accelerando.devices import DeviceBackend
from accelerando.enums import DistributedType
from accelerando.environments import ClusterEnvironment
from accelerando.gradient_state import GradientState

__all__ = [
    "AcceleratorState",
    "DistributedType",
    "GradientState",
    "PartialState",
    "get_active_deepspeed_plugin",
    "select_deepspeed_plugin",
]

F = TypeVar("F", bound=Callable[..., Any])


def _view_is_read_only(owner: str, name: str) -> AttributeError:
    return AttributeError(
        f"{owner}.{name} is a read-only view of what the Accelerator decided; pass the value to "
        f"Accelerator(...) (or set it through the launcher / config file) instead of assigning it"
    )


class PartialState:
    """The state of this process in the job, shared by every instance in the process.

    A read-only view over the process's :class:`~accelerando.runtime.ProcessContext`. The first
    construction in a process asks the connector to detect the cluster environment (torchrun, MPI,
    SLURM or single process) and the device family, pick this process's device, and, when there is
    more than one process, start the default ``torch.distributed`` process group (gloo on CPU, nccl
    on CUDA, ...). Later constructions return the same state at almost no cost.

    Args:
        cpu: force the CPU even when an accelerator is present (False = let the settings decide).
        **kwargs: ``backend`` (process-group backend name) and ``timeout`` (``timedelta``) override the
            defaults; the Accelerator passes them from ``InitProcessGroupKwargs``.

    Raises:
        ValueError: an explicit backend that the device family cannot use.
        RuntimeError: the rendezvous with the other processes failed (from torch.distributed).
    """

    _shared_state: dict[str, Any] = {}
    _view_names = frozenset(
        {
            "cluster",
            "device_backend",
            "num_processes",
            "process_index",
            "local_process_index",
            "num_nodes",
            "device",
            "backend",
            "distributed_type",
            "debug",
        }
    )

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self.__dict__ = self._shared_state
        if runtime.current_process() is not None:
            return
        from accelerando.settings import resolve_runtime_settings

        settings = resolve_runtime_settings({"cpu": True if cpu else None})
        options = {k: kwargs[k] for k in ("backend", "timeout") if kwargs.get(k) is not None}
        runtime.start_process(settings, options)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._view_names:
            raise _view_is_read_only(type(self).__name__, name)
        super().__setattr__(name, value)

    @property
    def _process(self) -> runtime.ProcessContext:
        context = runtime.current_process()
        if context is None:  # the state was reset (tests): detect again, as a first construction would
            PartialState()
            context = runtime.current_process()
        assert context is not None
        return context

    @property
    def cluster(self) -> ClusterEnvironment:
        """The cluster environment rank and world size come from."""
        return self._process.cluster

    @property
    def device_backend(self) -> type[DeviceBackend]:
        """The hardware family class of this process's device."""
        return self._process.device_backend

    @property
    def num_processes(self) -> int:
        """Total number of processes in the job."""
        return self._process.num_processes

    @property
    def process_index(self) -> int:
        """Global index of this process."""
        return self._process.process_index

    @property
    def local_process_index(self) -> int:
        """Index of this process on its machine."""
        return self._process.local_process_index

    @property
    def num_nodes(self) -> int:
        """Number of machines in the job."""
        return self._process.num_nodes

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self._process.device

    @property
    def backend(self) -> str | None:
        """The process-group backend (``"gloo"``, ``"nccl"``...); None in a single process."""
        return self._process.backend

    @property
    def distributed_type(self) -> DistributedType:
        """The data-parallel type of this job (NO, MULTI_CPU, MULTI_GPU, ...)."""
        return self._process.distributed_type

    @property
    def debug(self) -> bool:
        """Whether debug mode (the ``debug`` setting) is on."""
        return self._process.debug

    # ----------------------------------------------------------------- queries
    @property
    def initialized(self) -> bool:
        """Whether the process state exists in this process."""
        return runtime.current_process() is not None

    @property
    def use_distributed(self) -> bool:
        """True when several processes cooperate (collectives are needed)."""
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        """True on the process of global index 0."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on the first process of each machine."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """True on the process of the highest global index."""
        return self.process_index == self.num_processes - 1

    @property
    def default_device(self) -> torch.device:
        """The device this process computes on."""
        return self.device

    # ------------------------------------------------------------ collectives
    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (no-op in a single process)."""
        if self.use_distributed:
            import torch.distributed as dist

            dist.barrier()

    @contextlib.contextmanager
    def _first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context manager: the main process runs the block first, the others after it.

        Example:
            >>> with state.main_process_first():
            ...     dataset = build_or_load_cached_dataset()
        """
        return self._first(self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context manager: each machine's first process runs the block first, the others after it."""
        return self._first(self.is_local_main_process)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's contiguous share of ``inputs`` (list, tuple, dict of those, or tensor).

        The first ``len % num_processes`` processes get one item more. With ``apply_padding`` every
        process gets the same count, the short ones repeating their last item (so results can be
        gathered; drop the extras afterwards).

        Raises:
            TypeError: ``inputs`` is not sliceable (or a dict whose values have different lengths).
        """
        if self.num_processes == 1:
            yield inputs
            return
        yield _split(inputs, self.num_processes, self.process_index, apply_padding)

    # ------------------------------------------------------- process filters
    def on_main_process(self, function: F) -> F:
        """Decorator: run ``function`` only on the main process (returns None elsewhere)."""
        return _only_when(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run ``function`` only on each machine's first process."""
        return _only_when(function, lambda: self.is_local_main_process)

    def on_last_process(self, function: F) -> F:
        """Decorator: run ``function`` only on the last process."""
        return _only_when(function, lambda: self.is_last_process)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` only on the process of global index ``process_index``."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return _only_when(function, lambda: self.process_index == process_index)

    def on_local_process(self, function: F | None = None, local_process_index: int | None = None) -> Any:
        """Decorator: run ``function`` only on the process of local index ``local_process_index``."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return _only_when(function, lambda: self.local_process_index == local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each machine's first process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group: Any | None = None) -> None:
        """Tear down the process group (the default one when ``group`` is None).

        For the default group every process should call this: they agree (bounded wait) before each
        destroys its group; see :meth:`accelerando.process_group.ProcessGroupHandle.shutdown`.
        """
        import torch.distributed as dist

        context = runtime.current_process()
        handle = context.process_group if context is not None else None
        if group is None and handle is not None:
            handle.shutdown()
        elif dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)

    @classmethod
    def _reset_state(cls) -> None:
        """Forget the process state (tests). Does not destroy the process group."""
        cls._shared_state.clear()
        runtime.forget(keep_process=False)

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}\nNum processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\nLocal process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )


def _only_when(function: F, predicate: Callable[[], bool]) -> F:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if predicate():
            return function(*args, **kwargs)
        return None

    return wrapper  # type: ignore[return-value]


def _split(inputs: Any, world: int, index: int, apply_padding: bool) -> Any:
    if isinstance(inputs, dict):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise TypeError("split_between_processes needs every dict value to have the same length")
        return {k: _split(v, world, index, apply_padding) for k, v in inputs.items()}
    if not hasattr(inputs, "__len__") or not hasattr(inputs, "__getitem__"):
        raise TypeError(
            f"split_between_processes cannot split a {type(inputs).__name__}; pass a list, tuple, dict or tensor"
        )
    per, extras = divmod(len(inputs), world)
    start = index * per + min(index, extras)
    end = start + per + (1 if index < extras else 0)
    part = inputs[start:end]
    target = per + (1 if extras else 0)
    if apply_padding and len(part) < target and len(inputs) > 0:
        missing = target - len(part)
        if isinstance(part, torch.Tensor):
            filler = (part[-1:] if len(part) else inputs[-1:]).repeat_interleave(missing, dim=0)
            part = torch.cat([part, filler], dim=0)
        else:
            last = part[-1] if len(part) else inputs[-1]
            part = (
                type(part)(list(part) + [last] * missing)
                if isinstance(part, tuple)
                else list(part) + [last] * missing
            )
    return part


class AcceleratorState:
    """What the newest Accelerator decided, on top of ``PartialState``; a read-only view.

    Reads the process's :class:`~accelerando.runtime.Runtime`: ``mixed_precision``,
    ``distributed_type`` (possibly FSDP, DEEPSPEED, MEGATRON_LM), ``deepspeed_plugins``,
    ``fsdp_plugin``, ``megatron_lm_plugin``, ``dynamo_plugin``, ``torch_tp_plugin``,
    ``parallelism_config``, ``device_mesh``. Before any Accelerator exists these are the process's
    defaults (``"no"`` precision, the plain data-parallel type, no plugins). Unknown attributes are
    read from ``PartialState``. The only thing written through it is the active DeepSpeed plugin
    (:meth:`select_deepspeed_plugin`).

    Args:
        cpu / pg_kwargs: passed to ``PartialState`` when the process state does not exist yet.
        **unused: other keyword arguments are refused (the view cannot be configured).

    Raises:
        TypeError: keyword arguments other than ``cpu`` / ``pg_kwargs``.
    """

    _shared_state: dict[str, Any] = {}
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

    def __init__(self, cpu: bool = False, pg_kwargs: dict[str, Any] | None = None, **unused: Any) -> None:
        if unused:
            raise TypeError(
                f"AcceleratorState() takes no settings ({', '.join(sorted(unused))}); pass them to Accelerator(...)"
            )
        self.__dict__ = self._shared_state
        self._shared_state.setdefault("active_deepspeed_plugin_name", None)
        if runtime.current_process() is None:
            PartialState(cpu=cpu, **(pg_kwargs or {}))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._view_names:
            if getattr(self, name) is value:  # re-stating what the runtime holds changes nothing
                return
            raise _view_is_read_only(type(self).__name__, name)
        super().__setattr__(name, value)

    @property
    def _partial(self) -> PartialState:
        return PartialState()

    @property
    def initialized(self) -> bool:
        """Whether an Accelerator has configured the state in this process."""
        return runtime.current() is not None

    @property
    def mixed_precision(self) -> str:
        """The mixed-precision mode in effect (``"no"`` before any Accelerator)."""
        current = runtime.current()
        return "no" if current is None else current.settings.mixed_precision

    @property
    def distributed_type(self) -> DistributedType:
        """How processes cooperate, as the Accelerator decided (the process's type before one)."""
        current = runtime.current()
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
    def device_mesh(self) -> Any:
        """The DeviceMesh built from the ParallelismConfig (None without one)."""
        current = runtime.current()
        return None if current is None else current.mesh

    @staticmethod
    def _plugin(name: str) -> Any:
        current = runtime.current()
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

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not found normally: defer to the process state.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(PartialState(), name)

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """Forget the Accelerator's decisions (and the process state when asked)."""
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
