"""Process state: who am I, how many of us are there, which device do I use.

``PartialState`` is created once per process (every instance shares one dictionary, the Borg
pattern) and initialises ``torch.distributed`` when the process is part of a multi-process job.
``AcceleratorState`` adds what the Accelerator decided (mixed precision, FSDP/DeepSpeed, plugins);
``GradientState`` tracks accumulation and dataloader progress.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import torch

from accelerando.devices import DeviceBackend, detect_device_backend
from accelerando.enums import DistributedType
from accelerando.environments import ClusterEnvironment, detect_environment
from accelerando.gradient_state import GradientState

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState"]

F = TypeVar("F", bound=Callable[..., Any])


def _resolve_cpu_flag(cpu: bool | None) -> bool:
    """cpu from code, else from the launcher's environment (ACCELERANDO_USE_CPU / ACCELERATE_USE_CPU)."""
    from accelerando.settings import resolve_runtime_settings

    return bool(resolve_runtime_settings(code={"cpu": True if cpu else None}).cpu)


class PartialState:
    """The state of this process in the job, shared by every instance in the process.

    The first construction detects the cluster environment (torchrun, MPI, SLURM or single process)
    and the device family, picks this process's device, and, when there is more than one process,
    initialises the default ``torch.distributed`` process group (gloo on CPU, nccl on CUDA, ...).
    Later constructions return the same state at almost no cost.

    Args:
        cpu: force the CPU even when an accelerator is present.
        **kwargs: ``backend`` (process-group backend name) and ``timeout`` (``timedelta``) override the
            defaults; the Accelerator passes them from ``InitProcessGroupKwargs``.

    Raises:
        ValueError: an explicit backend that the device family cannot use.
        RuntimeError: the rendezvous with the other processes failed (from torch.distributed).
    """

    _shared_state: dict[str, Any] = {}

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self.__dict__ = self._shared_state
        if self._shared_state.get("_initialized"):
            return
        self._cpu = _resolve_cpu_flag(cpu)
        self.cluster: ClusterEnvironment = detect_environment()
        self.device_backend: type[DeviceBackend] = detect_device_backend(self._cpu)
        self.num_processes = self.cluster.world_size
        self.process_index = self.cluster.rank
        self.local_process_index = self.cluster.local_rank
        self.num_nodes = max(1, math.ceil(self.num_processes / max(self.cluster.local_world_size, 1)))
        self.device = self.device_backend.device(self.local_process_index)
        self.backend: str | None = None
        from accelerando.connector import process_distributed_type

        self.distributed_type = process_distributed_type(self.device_backend, self.num_processes)
        if self.num_processes > 1:
            self._init_process_group(kwargs.get("backend"), kwargs.get("timeout"))
        self.device_backend.set_device(self.device)
        self._initialized = True

    def _init_process_group(self, backend: str | None, timeout: timedelta | None) -> None:
        from accelerando import process_group

        # The handle owns the group's life, including its ordered teardown at exit.
        self._process_group = process_group.start(
            device=self.device,
            default_backend=self.device_backend.dist_backend,
            main_address=self.cluster.main_address,
            main_port=self.cluster.main_port,
            rank=self.process_index,
            world_size=self.num_processes,
            backend=backend,
            timeout=timeout,
        )
        self.backend = self._process_group.backend

    # ----------------------------------------------------------------- queries
    @property
    def initialized(self) -> bool:
        """Whether the shared state exists in this process."""
        return bool(self._shared_state.get("_initialized"))

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

        handle = self._shared_state.get("_process_group")
        if group is None and handle is not None:
            handle.shutdown()
        elif dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)

    @classmethod
    def _reset_state(cls) -> None:
        """Forget the shared state (tests). Does not destroy the process group."""
        cls._shared_state.clear()

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
    """The Accelerator's decisions on top of ``PartialState``, shared by every instance in the process.

    Attributes beyond PartialState's: ``mixed_precision``, ``distributed_type`` (possibly FSDP,
    DEEPSPEED, MEGATRON_LM), ``deepspeed_plugins``, ``fsdp_plugin``, ``megatron_lm_plugin``,
    ``dynamo_plugin``, ``torch_tp_plugin``, ``parallelism_config``. Unknown attributes are read from
    ``PartialState``.
    """

    _shared_state: dict[str, Any] = {}

    def __init__(self, **decisions: Any) -> None:
        self.__dict__ = self._shared_state
        if not self._shared_state.get("_initialized"):
            self._partial = PartialState(
                cpu=bool(decisions.pop("cpu", False)), **decisions.pop("pg_kwargs", {})
            )
            self.mixed_precision = "no"
            self.distributed_type = self._partial.distributed_type
            self.deepspeed_plugins: Any = None
            self.active_deepspeed_plugin_name: str | None = None
            self.fsdp_plugin: Any = None
            self.megatron_lm_plugin: Any = None
            self.dynamo_plugin: Any = None
            self.torch_tp_plugin: Any = None
            self.parallelism_config: Any = None
            self.device_mesh: Any = None
            self._initialized = True
        else:
            decisions.pop("cpu", None)
            decisions.pop("pg_kwargs", None)
        for key, value in decisions.items():
            setattr(self, key, value)

    @property
    def initialized(self) -> bool:
        """Whether an Accelerator has configured the state in this process."""
        return bool(self._shared_state.get("_initialized"))

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
        from accelerando.utils.deepspeed import select_deepspeed_plugin

        select_deepspeed_plugin(self, name)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not found normally: defer to the process state.
        if name.startswith("__") or name == "_partial":
            raise AttributeError(name)
        return getattr(self._partial, name)

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """Forget the Accelerator's decisions (and the process state when asked)."""
        cls._shared_state.clear()
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
