"""PartialState: who am I, how many of us are there, which device do I use.

A read-only view over the process's :class:`~accelerando.core.runtime.ProcessContext`, which the
connector builds. Every instance shares one dictionary (the Borg pattern), so ``PartialState()``
anywhere is the same object.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, overload

import torch

import accelerando.core.runtime as runtime
from accelerando.core.devices import DeviceBackend
from accelerando.core.enums import DistributedType
from accelerando.core.environments import ClusterEnvironment
from accelerando.core.settings import resolve_runtime_settings
from accelerando.state.shared import fork_launched, missing_attribute, view_is_read_only

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["PartialState", "process_filter"]

F = TypeVar("F", bound=Callable[..., object])
_T = TypeVar("_T")


class PartialState:
    """The state of this process in the job, shared by every instance in the process.

    A read-only view over the process's :class:`~accelerando.core.runtime.ProcessContext`. The first
    construction in a process asks the connector to detect the cluster environment (torchrun, MPI,
    SLURM or single process) and the device family, pick this process's device, and, when there is
    more than one process, start the default ``torch.distributed`` process group (gloo on CPU, nccl
    on CUDA, ...). Later constructions return the same state at almost no cost.

    Args:
        cpu: force the CPU even when an accelerator is present (False = let the settings decide).
        **kwargs: ``backend`` (process-group backend name) and ``timeout`` (``timedelta``) override the
            defaults; the Accelerator passes them from ``InitProcessGroupKwargs``.

    Raises:
        ValueError: an explicit backend that the device family cannot use; ``cpu=True`` once the
            process computes on an accelerator (the placement is fixed until ``_reset_state()``).
        RuntimeError: the rendezvous with the other processes failed (from torch.distributed).
    """

    # The shared dict also holds a snapshot of the process's facts under the reference's keys
    # (``_STATE_KEYS``): code outside (transformers' ``TrainingArguments(use_configured_state=True)``)
    # reads ``PartialState._shared_state`` to learn whether a state exists. The properties below read
    # the process context itself; the snapshot never drives a decision.
    _shared_state: dict[str, object] = {}
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

    def __init__(self, cpu: bool = False, **kwargs: object) -> None:
        self.__dict__ = self._shared_state
        existing = runtime.current_process()
        if existing is not None:
            runtime.refuse_cpu_switch(existing, cpu)
        else:
            settings = resolve_runtime_settings({"cpu": True if cpu else None})
            options = {k: kwargs[k] for k in ("backend", "timeout") if kwargs.get(k) is not None}
            runtime.start_process(settings, options)
            self._shared_state["_cpu"] = bool(settings.cpu)
        if "device" not in self._shared_state:
            self._publish(cpu)

    def _publish(self, cpu: bool) -> None:
        """Write the process's facts into the shared dict under the reference's keys (see above)."""
        context = runtime.current_process()
        assert context is not None
        current = runtime.current()
        if "_cpu" not in self._shared_state:
            self._shared_state["_cpu"] = bool(cpu) or bool(current is not None and current.settings.cpu)
        self._shared_state.update(
            backend=context.backend,
            device=context.device,
            debug=context.debug,
            distributed_type=context.distributed_type,
            num_processes=context.num_processes,
            process_index=context.process_index,
            local_process_index=context.local_process_index,
            fork_launched=fork_launched(),
        )

    def __getattr__(self, name: str) -> NoReturn:
        # Reached when normal lookup fails, including when a property below raised AttributeError
        # because the state was reset (``_reset_state()``) and not created again.
        after_reset = runtime.current_process() is None and (name in _STATE_KEYS or name in self._view_names)
        raise missing_attribute(type(self).__name__, name, after_reset=after_reset)

    def __setattr__(self, name: str, value: object) -> None:
        if name in self._view_names:
            raise view_is_read_only(type(self).__name__, name)
        super().__setattr__(name, value)

    @property
    def _process(self) -> runtime.ProcessContext:
        context = runtime.current_process()
        if context is None:
            # The state was reset and not created again: ``__getattr__`` names the attribute asked for.
            raise AttributeError("_process")
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

    def set_device(self) -> None:
        """Make this process's device the current one of its family (``torch.cuda.set_device`` ...).

        The process state already did it once; call again after code that switched devices. A
        no-op on the CPU.
        """
        self.device_backend.set_device(self.device)

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
    def split_between_processes(self, inputs: _T, apply_padding: bool = False) -> Iterator[_T]:
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
    # Each filter decides when the decorated function is called (not when it is decorated), so a
    # function decorated before the state exists still filters correctly. In a single process every
    # filter runs its function, whatever index it names: one process does every process's work.
    @overload
    def on_main_process(self, function: F) -> F: ...
    @overload
    def on_main_process(self, function: None = None) -> Callable[[F], F]: ...
    def on_main_process(self, function: F | None = None) -> F | Callable[[F], F]:
        """Decorator: run ``function`` only on the main process (returns None elsewhere).

        Usable bare (``@state.on_main_process``) or called (``@state.on_main_process()``).
        """
        if function is None:
            return self.on_main_process
        return process_filter(function, lambda: self.is_main_process)

    @overload
    def on_local_main_process(self, function: F) -> F: ...
    @overload
    def on_local_main_process(self, function: None = None) -> Callable[[F], F]: ...
    def on_local_main_process(self, function: F | None = None) -> F | Callable[[F], F]:
        """Decorator: run ``function`` only on each machine's first process (bare or called)."""
        if function is None:
            return self.on_local_main_process
        return process_filter(function, lambda: self.is_local_main_process)

    @overload
    def on_last_process(self, function: F) -> F: ...
    @overload
    def on_last_process(self, function: None = None) -> Callable[[F], F]: ...
    def on_last_process(self, function: F | None = None) -> F | Callable[[F], F]:
        """Decorator: run ``function`` only on the last process (bare or called)."""
        if function is None:
            return self.on_last_process
        return process_filter(function, lambda: self.is_last_process)

    @overload
    def on_process(self, function: F, process_index: int | None = None) -> F: ...
    @overload
    def on_process(self, function: None = None, process_index: int | None = None) -> Callable[[F], F]: ...
    def on_process(self, function: F | None = None, process_index: int | None = None) -> F | Callable[[F], F]:
        """Decorator: run ``function`` only on the process of global index ``process_index``.

        ``@state.on_process(process_index=1)`` returns the decorator.

        Raises:
            ValueError: a function is given without ``process_index``.
        """
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        if process_index is None:
            raise ValueError("on_process needs process_index=<global index of the process that runs it>")
        return process_filter(function, lambda: self.process_index == process_index)

    @overload
    def on_local_process(self, function: F, local_process_index: int | None = None) -> F: ...
    @overload
    def on_local_process(
        self, function: None = None, local_process_index: int | None = None
    ) -> Callable[[F], F]: ...
    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> F | Callable[[F], F]:
        """Decorator: run ``function`` only on the process of local index ``local_process_index``.

        Raises:
            ValueError: a function is given without ``local_process_index``.
        """
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        if local_process_index is None:
            raise ValueError(
                "on_local_process needs local_process_index=<index of the process on its machine>"
            )
        return process_filter(function, lambda: self.local_process_index == local_process_index)

    # Any: print's own keywords (sep, end, file, flush), passed on as given.
    def print(self, *args: object, **kwargs: Any) -> None:
        """``print`` on each machine's first process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group: ProcessGroup | None = None) -> None:
        """Tear down the process group (the default one when ``group`` is None).

        For the default group every process should call this: they agree (bounded wait) before each
        destroys its group; see :meth:`accelerando.core.process_group.ProcessGroupHandle.shutdown`.
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
        """Forget the process state (tests). Does not destroy the process group.

        Until the next ``PartialState()`` or ``Accelerator()``, reading the state's attributes from an
        existing instance raises ``AttributeError`` saying so.
        """
        cls._shared_state.clear()
        runtime.forget(keep_process=False)

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}\nNum processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\nLocal process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )


# The reference's keys of the process facts in ``PartialState._shared_state``.
_STATE_KEYS = frozenset(
    {
        "_cpu",
        "backend",
        "device",
        "debug",
        "distributed_type",
        "num_processes",
        "process_index",
        "local_process_index",
        "fork_launched",
    }
)


def process_filter(function: F, predicate: Callable[[], bool]) -> F:
    """Wrap ``function`` so that it runs when ``predicate()`` holds or in a single process.

    Elsewhere the wrapper returns None without calling it. The predicate is evaluated at each call.
    """

    @functools.wraps(function)
    def wrapper(*args: object, **kwargs: object) -> object:
        if predicate() or not PartialState().use_distributed:
            return function(*args, **kwargs)
        return None

    return wrapper  # type: ignore[return-value]


# Any: lists, tuples, dicts of those and tensors, sliced alike (their common operations are not one type).
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
