"""MegatronStrategy: Megatron-LM training over megatron-core, or a clear refusal where it cannot run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

import torch

from accelerando.backends.precision.base import Precision
from accelerando.backends.strategies.base import (
    ManagesPrecision,
    Prepared,
    PrepareRequest,
    ScalesLossForAccumulation,
    Strategy,
)
from accelerando.backends.strategies.megatron.engine import (
    MegatronEngine,
    MegatronLMOptimizerWrapper,
    MegatronLMSchedulerWrapper,
)
from accelerando.backends.strategies.megatron.holder import Holder, HolderState
from accelerando.backends.strategies.megatron.requirements import require_megatron_and_cuda
from accelerando.backends.strategies.megatron.setup import (
    initialize,
    prepare_data_loader,
    prepare_model_optimizer_scheduler,
)
from accelerando.backends.strategies.megatron.train_steps import (
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
)
from accelerando.checkpointing.target import LoadsOwnCheckpoints
from accelerando.core.enums import DistributedType
from accelerando.core.runtime import Runtime

if TYPE_CHECKING:
    from accelerando.plugins.megatron import MegatronLMPlugin

__all__ = ["MegatronStrategy"]

_WHAT = "Megatron-LM training (megatron_lm_plugin or --use_megatron_lm)"


def _kind(obj: object) -> str | None:
    if isinstance(obj, torch.nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, (torch.utils.data.DataLoader, MegatronLMDummyDataLoader)):
        return "dataloader"
    if isinstance(obj, MegatronLMDummyScheduler) or (hasattr(obj, "step") and hasattr(obj, "optimizer")):
        return "scheduler"
    return None


def _refuse_alone(method: str, what_together: str) -> NoReturn:
    """Refuse preparing one object on its own: Megatron-LM builds them in one ``prepare`` call."""
    require_megatron_and_cuda(_WHAT)
    raise ValueError(
        f"Megatron-LM builds {what_together}: call accelerator.prepare(model, optimizer, scheduler, dataloader) "
        f"instead of {method}"
    )


class MegatronStrategy(ManagesPrecision, ScalesLossForAccumulation, LoadsOwnCheckpoints, Strategy):
    """Megatron-LM tensor / pipeline / data parallelism over megatron-core, on CUDA GPUs.

    Chosen by the connector for a ``MegatronLMPlugin`` or ``--use_megatron_lm``. Creating the
    Accelerator succeeds anywhere (its settings can be inspected). ``prepare`` needs megatron-core
    and CUDA, and without them refuses before touching any object, naming what is missing and the
    torch-native alternatives (``ParallelismConfig(tp_size=...)``, ``PipelineParallelPlugin``);
    there is never a silent fallback to DDP.

    With them, ``prepare`` (model, optimizer, ``MegatronLMDummyScheduler``, dataloaders, in one
    call) reads the architecture, batch, optimizer and schedule into the plugin's arguments,
    initialises megatron-core, builds megatron-core's own model / optimizer / schedule, and returns
    a :class:`~accelerando.backends.strategies.megatron.engine.MegatronEngine` for the model: calling it
    runs a whole training step. ``backward``, ``optimizer.step()``, ``scheduler.step()`` and
    ``zero_grad()`` are then no-ops; the engine clips gradients with the plugin's
    ``gradient_clipping`` and saves / loads checkpoints with megatron-core's distributed checkpointing.
    """

    distributed_type = DistributedType.MEGATRON_LM
    name = "megatron"

    def __init__(self, runtime: Runtime, precision: Precision, **options: object) -> None:
        super().__init__(runtime, precision, **options)
        self.engine: MegatronEngine | None = None

    def _holder(self) -> Holder:
        # The reference's Megatron functions take the Accelerator and read only these of its state.
        runtime = self.runtime
        state = HolderState(
            megatron_lm_plugin=runtime.plugins.megatron_lm,
            device=runtime.device,
            num_processes=runtime.num_processes,
        )
        return Holder(state=state)

    # ------------------------------------------------------------------ prepare
    def prepare_all(self, request: PrepareRequest) -> Prepared:
        """Build Megatron-LM's engine from the model, optimizer, scheduler and dataloaders of one call.

        Raises:
            MegatronLMUnavailableError: megatron-core or CUDA is missing (nothing was touched).
            ValueError: several models, a second model after an engine was built, a scheduler that is
                not a ``MegatronLMDummyScheduler``, an optimizer Megatron-LM cannot rebuild, or
                gradient accumulation (Megatron accumulates over ``num_micro_batches``).
        """
        require_megatron_and_cuda(_WHAT)
        if request.gradient_accumulation_steps > 1:
            raise ValueError(
                f"gradient_accumulation_steps={request.gradient_accumulation_steps} with Megatron-LM: the engine "
                "accumulates over micro-batches itself; use MegatronLMPlugin(num_micro_batches=...) and "
                "gradient_accumulation_steps=1"
            )
        found: dict[str, list[int]] = {"model": [], "optimizer": [], "scheduler": [], "dataloader": []}
        for index, obj in enumerate(request.objects):
            kind = _kind(obj)
            if kind is not None and not request.is_prepared(obj):
                found[kind].append(index)
        if len(found["model"]) > 1 or (found["model"] and self.engine is not None):
            raise ValueError("Megatron-LM trains one model per Accelerator: prepare a single model")
        pick = {kind: (request.objects[where[0]] if where else None) for kind, where in found.items()}
        plugin: MegatronLMPlugin | None = self.runtime.plugins.megatron_lm
        assert plugin is not None, "the connector chooses this strategy for a MegatronLMPlugin only"
        self._fill_arguments(plugin, pick, request)

        if pick["model"] is not None or not _initialized():
            initialize(self._holder(), args_defaults=plugin.megatron_lm_default_args)
        prepared = Prepared(objects=list(request.objects))
        if pick["model"] is not None:
            self._build_engine(prepared, found)
        self._prepare_loaders(prepared, found["dataloader"])
        return prepared

    def _build_engine(self, prepared: Prepared, found: dict[str, list[int]]) -> None:
        """Build megatron-core's model / optimizer / schedule and the engine; put them where the user's objects were."""
        holder = self._holder()
        model, optimizer, scheduler = prepare_model_optimizer_scheduler(holder)
        self.engine = MegatronEngine(holder, model, optimizer, scheduler)
        wrapped_optimizer = MegatronLMOptimizerWrapper(optimizer)
        made = {
            "model": self.engine,
            "optimizer": wrapped_optimizer,
            "scheduler": MegatronLMSchedulerWrapper(scheduler, wrapped_optimizer),
        }
        prepared.models.append(self.engine)
        if found["optimizer"]:
            prepared.optimizers.append(wrapped_optimizer)
        if found["scheduler"]:
            prepared.schedulers.append(made["scheduler"])
        for kind in ("model", "optimizer", "scheduler"):
            for index in found[kind]:
                prepared.objects[index] = made[kind]

    def _prepare_loaders(self, prepared: Prepared, indices: list[int]) -> None:
        """Re-make torch loaders for the data-parallel ranks; dummy loaders become Megatron's iterators.

        The k-th loader of the call, when a ``MegatronLMDummyDataLoader``, gets the k-th of Megatron's
        (train, valid, test) iterators, all built once.
        """
        iterators = None
        for position, index in enumerate(indices):
            loader = prepared.objects[index]
            if isinstance(loader, MegatronLMDummyDataLoader):
                if iterators is None:
                    iterators = prepare_data_loader(self._holder(), loader)
                prepared.objects[index] = iterators[position] if position < len(iterators) else None
            else:
                assert isinstance(loader, torch.utils.data.DataLoader), "_kind found a DataLoader here"
                prepared.objects[index] = prepare_data_loader(self._holder(), loader)

    def _fill_arguments(
        self, plugin: MegatronLMPlugin, pick: dict[str, object], request: PrepareRequest
    ) -> None:
        """Read batch size, architecture, optimizer, schedule and precision into the plugin's arguments."""
        loader, batch_data, micro_batch_size = pick["dataloader"], None, None
        if isinstance(loader, MegatronLMDummyDataLoader):
            loader.set_megatron_data_args()
            given = loader.dataset_args.get("micro_batch_size", 1)
            micro_batch_size = int(given) if isinstance(given, (int, float, str)) else 1
        elif isinstance(loader, torch.utils.data.DataLoader):  # what _kind calls the other loaders
            batch_data = next(iter(loader))
            sizes = [
                int(getattr(o, "batch_size", 0) or 0) for o in request.objects if _kind(o) == "dataloader"
            ]
            sizes = [size for size in sizes if size] or [1]
            # Several loaders: the plugin's is_train_batch_min picks the smallest or the largest batch.
            micro_batch_size = min(sizes) if plugin.is_train_batch_min else max(sizes)
            if request.split_batches:
                micro_batch_size //= self.runtime.num_processes
        if micro_batch_size is not None:
            model_parallel = (
                int(plugin.tp_degree or 1)
                * int(plugin.pp_degree or 1)
                * int(plugin.context_parallel_size or 1)
            )
            plugin.set_training_args(micro_batch_size, self.runtime.num_processes // model_parallel)
        if pick["model"] is not None and plugin.custom_model_provider_function is None:
            plugin.set_network_size_args(pick["model"], batch_data)
        if pick["optimizer"] is not None:
            plugin.set_optimizer_type(pick["optimizer"])
        scheduler = pick["scheduler"]
        if scheduler is not None:
            if not isinstance(scheduler, MegatronLMDummyScheduler):
                raise ValueError(
                    "Megatron-LM builds its own learning-rate schedule: pass "
                    "accelerando.utils.MegatronLMDummyScheduler(optimizer, total_num_steps=..., warmup_num_steps=...) "
                    f"instead of {type(scheduler).__name__}"
                )
            plugin.set_scheduler_args(scheduler)
        plugin.set_mixed_precision(self.runtime.mixed_precision)

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool = True, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Refuse: Megatron-LM builds model, optimizer and schedule together in ``prepare(...)``.

        Raises:
            MegatronLMUnavailableError: megatron-core or CUDA is missing.
            ValueError: with both present (use ``accelerator.prepare(model, optimizer, ...)``).
        """
        _refuse_alone("prepare_model", "its model, optimizer and schedule together")

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Refuse: see :meth:`prepare_model`.

        Raises:
            MegatronLMUnavailableError: megatron-core or CUDA is missing.
            ValueError: with both present (use ``accelerator.prepare(model, optimizer, ...)``).
        """
        _refuse_alone("prepare_optimizer", "its optimizer with the model")

    # ------------------------------------------------------------------ training
    def backward(self, loss: torch.Tensor, **kwargs: object) -> None:
        """No-op: the engine's train step (the prepared model's call) already ran the backward passes."""

    def _no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """No-op context: the engine synchronises gradients once per global batch itself."""
        return contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> None:  # type: ignore[override]
        """No-op returning None: the engine clips in its step to ``MegatronLMPlugin(gradient_clipping=...)``."""
        return None

    # ------------------------------------------------------------------ checkpoints
    def save_model_checkpoint(
        self, model: torch.nn.Module, output_dir: str, index: int, safe_serialization: bool
    ) -> bool:
        """Save the engine (model, optimizer, schedule) with megatron-core's distributed checkpointing."""
        if not isinstance(model, MegatronEngine):
            return False
        model.save_checkpoint(output_dir)
        return True

    def load_model_checkpoint(self, model: torch.nn.Module, input_dir: str, index: int) -> bool:
        """Load what :meth:`save_model_checkpoint` wrote."""
        if not isinstance(model, MegatronEngine):
            return False
        model.load_checkpoint(input_dir)
        return True

    def save_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, output_dir: str, index: int
    ) -> bool:
        """True for the engine's optimizer: its state is in the engine's checkpoint."""
        return isinstance(optimizer, MegatronLMOptimizerWrapper)

    def load_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, input_dir: str, index: int
    ) -> bool:
        """True for the engine's optimizer: the engine's checkpoint restored it."""
        return isinstance(optimizer, MegatronLMOptimizerWrapper)


def _initialized() -> bool:
    from megatron.core import parallel_state as ps  # type: ignore[import-not-found]

    return bool(ps.model_parallel_is_initialized())
