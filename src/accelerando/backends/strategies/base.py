"""The strategy contract: how models are wrapped and how processes cooperate on them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

import torch
from typing_extensions import override

from accelerando.backends.precision.base import Precision
from accelerando.common.unwrap import unwrap_model
from accelerando.core.enums import DistributedType
from accelerando.core.runtime import Plugins, ProcessContext, Runtime

if TYPE_CHECKING:
    from torch.distributed.algorithms.join import Joinable
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils.data import DataLoader

    from accelerando.backends.strategies.conversion import Conversion
    from accelerando.optimizer import AcceleratedOptimizer
    from accelerando.scheduler import AcceleratedScheduler

__all__ = [
    "SEQUENCE_PARALLEL_NEEDED",
    "ManagesPrecision",
    "PrepareRequest",
    "Prepared",
    "ReplicatesParameters",
    "ScalesLossForAccumulation",
    "SingleDeviceStrategy",
    "SkipsSync",
    "Strategy",
]

# Strategies whose checkpoints are plain full files and whose loads convert other layouts.
_PLAIN_STRATEGIES = ("single", "ddp")

#: Why ``Accelerator.deepspeed_ulysses_dl_adapter`` was refused, and the fix.
SEQUENCE_PARALLEL_NEEDED = (
    "deepspeed_ulysses_dl_adapter needs sequence parallelism: pass "
    "Accelerator(parallelism_config=ParallelismConfig(sp_size=N, sp_backend='deepspeed')) with a "
    "DeepSpeed plugin"
)


@runtime_checkable
class SkipsSync(Protocol):
    """A model wrapper with its own ``no_sync`` context (torch's DDP, torchft's DDP, FSDP1)."""

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """Context in which backward passes accumulate gradients locally."""
        ...


@dataclass(frozen=True, slots=True)
class PrepareRequest:
    """What the facade hands a strategy for one ``Accelerator.prepare`` call.

    Attributes:
        objects: the objects passed to ``prepare``, in the caller's order.
        device_placement: one entry per object (None = the Accelerator's default).
        gradient_accumulation_steps: the Accelerator's value at the time of the call.
        split_batches: whether dataloader batches are split across processes.
        prepare_data_loader: the facade's dataloader preparation, ``(loader, device_placement) -> loader``.
        is_prepared: whether an object is already registered with the facade.
    """

    objects: tuple[object, ...]
    device_placement: tuple[bool | None, ...]
    gradient_accumulation_steps: int
    split_batches: bool
    prepare_data_loader: Callable[[DataLoader[object], bool | None], object]
    is_prepared: Callable[[object], bool]


# Typed empty lists for Prepared's fields (the wrapper classes are imported for type checking only).
def _no_optimizers() -> list[AcceleratedOptimizer]:
    return []


def _no_schedulers() -> list[AcceleratedScheduler]:
    return []


@dataclass(slots=True)
class Prepared:
    """What a strategy made of one ``prepare`` call; the facade registers it (the strategy never does).

    Attributes:
        objects: the prepared objects, in the caller's order (what ``prepare`` returns).
        models: models to register (e.g. DeepSpeed engines).
        optimizers: optimizers to register (wrappers the user's loop steps).
        schedulers: schedulers to register.
        engine: the backend's engine handle (``accelerator.deepspeed_engine_wrapped``), or None.
        fixed_settings: Accelerator settings the backend fixed, e.g. ``{"gradient_accumulation_steps": 4}``.
    """

    objects: list[object]
    models: list[torch.nn.Module] = field(default_factory=lambda: list[torch.nn.Module]())
    optimizers: list[AcceleratedOptimizer] = field(default_factory=_no_optimizers)
    schedulers: list[AcceleratedScheduler] = field(default_factory=_no_schedulers)
    engine: object = None
    fixed_settings: dict[str, int] = field(default_factory=lambda: dict[str, int]())


# ------------------------------------------------------------------ capabilities
# What a strategy can do beyond the base contract, as small interfaces it inherits. The layers around
# a strategy ask ``isinstance(strategy, ManagesPrecision)`` (``issubclass`` on the class, before it is
# built) instead of probing its type or name. Each interface names the methods that carry the
# capability; a strategy that has it lists the interface before ``Strategy`` in its bases, so a method
# it forgot raises NotImplementedError instead of running the one-device default. Plain classes, not
# ``abc.ABC``: isinstance against a plain class runs in C, an ABC's ``__instancecheck__`` is a Python
# call, and ``Accelerator.backward`` asks on every accumulating micro-batch
# (tests/facade/test_hot_path_calls.py). They live here, not in a module of their own: the first
# ``Accelerator()`` loads this module anyway (tests/runtime/test_import_budget.py counts modules).
# The checkpointing layer, below, declares the fourth: ``checkpointing.target.LoadsOwnCheckpoints``.
# tests/strategies/test_capabilities.py pins which registered strategy has which.


class ManagesPrecision:
    """The engine applies mixed precision and loss scaling itself (DeepSpeed, Megatron-LM).

    Its engine is built from the model and optimizer together and casts them, keeps master weights
    and scales the loss from its own configuration. So the connector builds the precision without a
    loss scaler (autocast stays), and ``prepare`` leaves the precision's model/optimizer conversion
    (MS-AMP, fp8) to the engine.
    """

    def prepare_all(self, request: PrepareRequest) -> Prepared:
        """Build the engine from every object of one ``prepare`` call, in the engine's precision.

        Raises:
            NotImplementedError: the strategy declares the capability without implementing it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement prepare_all (ManagesPrecision)")


class ScalesLossForAccumulation:
    """The engine divides the loss by its gradient accumulation steps itself (DeepSpeed, Megatron-LM).

    ``Accelerator.backward`` then hands the loss over undivided; every other strategy gets it
    divided by the accumulation steps first.
    """

    def backward(self, loss: torch.Tensor, **kwargs: object) -> None:
        """Back-propagate the undivided ``loss`` through the engine, which scales it for accumulation.

        Raises:
            NotImplementedError: the strategy declares the capability without implementing it.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement backward (ScalesLossForAccumulation)"
        )


class ReplicatesParameters:
    """Plain data parallelism: every process holds the whole model as plain parameters (one device, DDP).

    A plain all-reduce of the parameters then averages the replicas, which is what ``LocalSGD``
    does. Sharding strategies, pipelines and engines do not have this capability.
    """

    def replica_parameters(self, model: torch.nn.Module) -> Iterator[torch.nn.Parameter]:
        """Every parameter of this process's whole copy of the prepared ``model`` (wrappers removed).

        Raises:
            NotImplementedError: the strategy declares the capability without implementing it.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement replica_parameters (ReplicatesParameters)"
        )


class Strategy:
    """Single-device training: no wrapping, no communication. Base class of every strategy.

    Contract (the Accelerator calls these, in this order):
    - ``prepare_model(model, device_placement, evaluation_mode)`` once per model, after the precision
      has converted it; returns the object the user's loop will call.
    - ``prepare_optimizer(optimizer)`` once per optimizer, after its models were prepared.
    - per micro-batch: ``no_sync(model)`` around non-sync steps, ``backward(loss)``.
    - ``clip_grad_norm_`` / ``clip_grad_value_`` on sync steps, after the precision unscaled.
    - ``unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)`` whenever the plain module is needed.
    - ``model_state_dict(model)`` returns the full (unsharded) state dict on the main process.

    Everything a strategy needs about the job (processes, device, mesh, settings, plugins) it reads
    from the ``runtime`` it is built with, never from global state; it never reads or writes the
    Accelerator. ``prepare_all`` returns what it made as a :class:`Prepared` record that the facade
    registers. What a strategy can do beyond this contract (an engine that manages precision, plain
    data parallelism, loading its own checkpoints...) it says by inheriting the small interfaces of
    this module (``ManagesPrecision``, ``ScalesLossForAccumulation``, ``ReplicatesParameters``) and of
    ``checkpointing.target`` (``LoadsOwnCheckpoints``); the registered one-device strategy is
    :class:`SingleDeviceStrategy`.

    Args:
        runtime: the finished Runtime (data: settings, process, mesh, plugins); the connector
            hands this strategy beside it.
        precision: the precision instance built for the same Runtime.
        options: strategy-specific settings (e.g. ``ddp_kwargs`` for DDP); ignored by the others.
    """

    distributed_type: DistributedType = DistributedType.NO
    name: ClassVar[str] = "single"
    # A conversion planned by plan_checkpoint_read, applied by apply_converted_checkpoint.
    _conversion: Conversion | None = None

    def __init__(self, runtime: Runtime, precision: Precision, **options: object) -> None:
        self.runtime = runtime
        self.precision = precision
        self.options = options

    @classmethod
    def own_mesh(cls, plugins: Plugins, process: ProcessContext) -> DeviceMesh | None:
        """The device mesh this strategy lays the processes out on itself, or None (the default).

        Called by the connector before the Runtime is built, for a job without a ParallelismConfig
        mesh; the result becomes ``runtime.mesh``. Collective when it returns a mesh: every process
        calls it at the same point.
        """
        return None

    # ------------------------------------------------------------------ wrap
    def prepare_all(self, request: PrepareRequest) -> Prepared | None:
        """Prepare every object of one ``Accelerator.prepare`` call at once, or return None.

        Strategies that must see model, optimizer and scheduler together (DeepSpeed builds one
        engine from all three) override this and return a :class:`Prepared` record (objects in the
        caller's order, plus what the facade must register); the default None lets the facade
        prepare objects one by one.

        Args:
            request: the objects of the call and the facade services the strategy may use.
        """
        return None

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Move ``model`` to this process's device (when ``device_placement``) and return it."""
        if device_placement:
            model = model.to(self.runtime.device)
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Return the optimizer the strategy will step (unchanged here)."""
        return optimizer

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """Return the user's module inside whatever ``prepare`` wrapped it in.

        One implementation for every strategy (:func:`accelerando.common.unwrap.unwrap_model`):
        DDP / FSDP1 / DeepSpeed engine wrappers and ``torch.compile`` are removed; FSDP2 models are
        their own module.

        Args:
            model: a prepared model.
            keep_fp32_wrapper: keep the precision plugin's forward wrapper (False restores the
                original ``forward``, modifying the model).
            keep_torch_compile: return a compiled module around the unwrapped one when ``model``
                was compiled.

        Raises:
            TypeError: ``model`` is not a ``torch.nn.Module``.
        """
        return unwrap_model(model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile)

    # -------------------------------------------------------------- training
    def backward(self, loss: torch.Tensor, **kwargs: object) -> None:
        """Back-propagate ``loss`` through the precision plugin."""
        self.precision.backward(loss, **kwargs)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Context in which backward passes of ``model`` do not communicate.

        The rule every strategy shares is written here once: a model wrapper that carries its own
        ``no_sync`` (torch's DDP, torchft's DDP, FSDP1) is asked for it; any other model goes to
        :meth:`_no_sync`, the hook strategies override. Only a strategy whose engine decides
        synchronisation itself (DeepSpeed: its engine's ``no_sync`` refuses ZeRO-2/3) overrides this
        method.
        """
        # Looked up on the class (in C), not with isinstance(model, SkipsSync): a runtime Protocol
        # check is ~30 Python-level calls, paid on every accumulating micro-batch (as typing.cast
        # would be one more: the method found on the class is called with the model).
        skip_sync = getattr(type(model), "no_sync", None)
        if skip_sync is not None:
            return skip_sync(model)
        return self._no_sync(model)

    def _no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Hook of :meth:`no_sync` for a model without its own ``no_sync``: nothing to skip here."""
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Context forcing the next backward to synchronise even inside ``no_sync``."""
        return contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the gradient norm of ``parameters``; return the total norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Clamp every gradient element into ``[-clip_value, clip_value]``."""
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # ------------------------------------------------------------ state dicts
    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict of ``model`` (unwrapped).

        Weights offloaded to CPU or disk by big-model hooks (which leave ``meta`` tensors in the
        module) are read back from their offload storage, so the result holds real tensors.
        """
        module = self.unwrap_model(model, keep_torch_compile=False)
        state = module.state_dict()
        if not any(t.device.type == "meta" for t in state.values() if isinstance(t, torch.Tensor)):
            return state
        state.update(_offloaded_tensors(module))
        return state

    def load_model_state_dict(
        self, model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True
    ) -> object:
        """Load a full state dict into ``model``; what ``torch.nn.Module.load_state_dict`` returns."""
        return self.unwrap_model(model, keep_torch_compile=False).load_state_dict(state_dict, strict=strict)

    # ------------------------------------------------------------ checkpoints
    def save_model_checkpoint(
        self, model: torch.nn.Module, output_dir: str, index: int, safe_serialization: bool
    ) -> bool:
        """Write ``model``'s training checkpoint into ``output_dir`` the strategy's own way.

        Returns False (the default) to let checkpointing write the full state dict itself;
        sharded strategies write per-rank files (e.g. torch.distributed.checkpoint) and return True.
        Called on every process.
        """
        return False

    def load_model_checkpoint(self, model: torch.nn.Module, input_dir: str, index: int) -> bool:
        """Load what ``save_model_checkpoint`` wrote; False = let checkpointing load the full state dict."""
        return False

    def save_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, output_dir: str, index: int
    ) -> bool:
        """Write an optimizer's state the strategy's own way; False = checkpointing's default."""
        return False

    def load_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, input_dir: str, index: int
    ) -> bool:
        """Load an optimizer's state written by ``save_optimizer_checkpoint``; False = default."""
        return False

    # ------------------------------------------------- checkpoints across strategies
    def checkpoint_layout(
        self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> dict[str, object]:
        """How ``save_state`` lays out models and optimizers here; recorded in the manifest.

        One process and DDP write ``"full"`` files (optimizers keyed by index, their parameter names
        recorded); a strategy that writes its own files names its own format, which only it reads.
        """
        if self.name in _PLAIN_STRATEGIES:
            return _conversions().plain_layout(self.name, models, optimizers)
        return {"strategy": self.name, "format": self.name}

    def reads_layout(self, layout: Mapping[str, object], saved_world: int) -> bool:
        """Whether this strategy's own checkpoint loading reads ``layout`` (saved by ``saved_world``)."""
        if self.name not in _PLAIN_STRATEGIES:
            return True  # strategies without a converter keep their own loading
        return layout.get("format") == "full" and layout.get("optimizer_keys") == "index"

    def plan_checkpoint_read(
        self, folder: str, layout: Mapping[str, object] | None, saved_world: int
    ) -> bool:
        """Decide, before anything is read, how ``folder`` loads: True when through a conversion.

        Raises:
            CheckpointConversionError: No conversion from the saved layout to this strategy exists
                (one line naming both and what to do).
        """
        C = _conversions()
        self._conversion = None
        if layout is None or self.reads_layout(layout, saved_world):
            return False
        C.refuse_unreadable(
            folder, layout, saved_world, f"{self.name} on {self.runtime.num_processes} process(es)"
        )
        self._conversion = C.Conversion(folder, layout, saved_world)
        return True

    def converts(self, folder: str) -> bool:
        """Whether ``plan_checkpoint_read`` planned a conversion for ``folder``."""
        return self._conversion is not None and self._conversion.folder == folder

    def read_converted_checkpoint(
        self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Read the planned folder into portable state and check it against the live objects.

        Raises:
            CheckpointConversionError: The saved state does not fit the live models or optimizers.
        """
        C = _conversions()
        conversion = self._conversion
        assert conversion is not None, "plan_checkpoint_read planned no conversion"
        conversion.states = C.read_portable(conversion, len(models), len(optimizers))
        for i, model in enumerate(models):
            C.check_portable(conversion.states[i], self._full_shapes(model), conversion.folder, i)
        self._check_converted_optimizers(conversion, models, optimizers)

    def _full_shapes(self, model: torch.nn.Module) -> Mapping[str, torch.Size]:
        """The full shape of every state-dict entry of a prepared model (the hook sharded strategies override)."""
        return _conversions().plain_shapes(model)

    def _check_converted_optimizers(
        self, conversion: Conversion, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Refuse converted optimizer states that do not fit the live optimizers (names, groups).

        Raises:
            CheckpointConversionError: Naming the optimizer and what differs.
        """
        C = _conversions()
        for i, optimizer in enumerate(optimizers):
            C.check_optimizer(
                conversion.states[i], C.optimizer_names(models, optimizer), conversion.folder, i
            )

    def apply_converted_checkpoint(
        self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Apply what ``read_converted_checkpoint`` read (plain modules and torch optimizers here)."""
        conversion, self._conversion = self._conversion, None
        assert conversion is not None, "read_converted_checkpoint read nothing"
        _conversions().apply_plain(conversion, models, optimizers)

    def join_uneven_inputs(
        self, joinables: list[Joinable], even_batches: bool | None = None
    ) -> contextlib.AbstractContextManager[object]:
        """Context letting processes with fewer batches finish (a no-op without DDP)."""
        return contextlib.nullcontext()

    def release(self) -> None:
        """Free what the strategy holds outside the prepared objects; nothing here.

        Called by ``Accelerator.free_memory`` after it dropped the prepared objects. Strategies
        whose engines hold buffers and hooks of their own (DeepSpeed) override it.
        """

    # ------------------------------------------------------ sequence / context
    def context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """Context sharding ``buffers`` along their sequence dims over the ``cp`` mesh axis.

        A no-op unless the parallelism config has ``cp_size > 1``; then torch's context parallelism
        (CUDA attention kernels) runs inside the block. Context parallelism composes onto any
        strategy with a mesh, so the base class does it.

        Raises:
            ValueError: ``cp_size > 1`` on a device other than CUDA (the message says why and the fix).
        """
        from accelerando.backends.strategies.context_parallel import maybe_context_parallel

        return maybe_context_parallel(
            self.runtime.plugins.parallelism_config,
            self.runtime.mesh,
            self.runtime.device.type,
            buffers=buffers,
            buffer_seq_dims=buffer_seq_dims,
            no_restore_buffers=no_restore_buffers,
        )

    def sequence_parallel_dataloader(
        self, dataloader: DataLoader[object], model: torch.nn.Module
    ) -> Iterable[object]:
        """Wrap a prepared dataloader so that each sequence-parallel rank gets its slice of every batch.

        Only DeepSpeed runs sequence parallelism (Ulysses), and overrides this.

        Raises:
            ValueError: this strategy has no sequence parallelism (the message says how to ask for it).
        """
        raise ValueError(SEQUENCE_PARALLEL_NEEDED)


class SingleDeviceStrategy(ReplicatesParameters, Strategy):
    """Train on this process's device: no wrapping, no communication; registered as ``"single"``.

    The :class:`Strategy` contract as written, plus the one capability the base class cannot carry
    (every strategy inherits the base): it holds the whole model as plain parameters, so ``LocalSGD``
    accepts it.
    """

    @override
    def replica_parameters(self, model: torch.nn.Module) -> Iterator[torch.nn.Parameter]:
        return self.unwrap_model(model).parameters()


def _offloaded_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the weights big-model hooks offloaded from ``module``, by state-dict key."""
    from accelerando.big_modeling.hooks import align_module_device, has_offloaded_params

    found: dict[str, torch.Tensor] = {}
    # torch's stub leaves named_modules' generator partly untyped.
    submodules: list[tuple[str, torch.nn.Module]] = list(module.named_modules())  # pyright: ignore[reportUnknownArgumentType]
    for prefix, sub in submodules:
        if not has_offloaded_params(sub):
            continue
        with align_module_device(sub, "cpu"):
            own: list[tuple[str, torch.Tensor]] = [
                *sub.named_parameters(recurse=False),
                *sub.named_buffers(recurse=False),
            ]
            for name, tensor in own:
                found[f"{prefix}.{name}" if prefix else name] = tensor.detach().clone()
    return found


def _conversions():  # noqa: ANN202 - the checker infers the module itself (ModuleType would erase it)
    """The checkpoint conversions (loaded with the checkpointing package, only when a checkpoint is)."""
    import accelerando.backends.strategies.conversion as conversions

    return conversions
