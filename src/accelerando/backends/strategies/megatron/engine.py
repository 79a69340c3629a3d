"""The Megatron-LM engine and the optimizer / scheduler wrappers the Accelerator hands back around it.

The engine is what ``prepare`` returns for the model: calling it runs one whole training step
(``train_step``: every micro-batch forward and backward through megatron-core's schedule, gradient
reduction, optimizer step, schedule step) in training mode, or one evaluation step in eval mode,
and returns the loss. The wrappers make the user's ``optimizer.step()`` / ``scheduler.step()`` /
``zero_grad()`` no-ops, since the engine already did them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, cast

import torch

from accelerando.backends.strategies.fsdp.state import weights_only_dcp_reads
from accelerando.backends.strategies.megatron.args import get_args
from accelerando.backends.strategies.megatron.board import TrainingBoard
from accelerando.backends.strategies.megatron.requirements import require_megatron_and_cuda
from accelerando.backends.strategies.megatron.train_steps import (
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    T5TrainStep,
)
from accelerando.optimizer import AcceleratedOptimizer
from accelerando.scheduler import AcceleratedScheduler

if TYPE_CHECKING:
    from megatron.core.optimizer import MegatronOptimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer.transformer_config import TransformerConfig

    from accelerando.backends.strategies.megatron.holder import MegatronAccelerator

__all__ = [
    "MegatronEngine",
    "MegatronLMOptimizerWrapper",
    "MegatronLMSchedulerWrapper",
    "split_micro_batches",
]

_TRAIN_STEPS = {"gpt": GPTTrainStep, "bert": BertTrainStep, "t5": T5TrainStep}
_TRACKER_FILE = "latest_checkpointed_iteration.txt"


class MegatronLMOptimizerWrapper(AcceleratedOptimizer):
    """The optimizer ``prepare`` returns under Megatron-LM: the engine steps and zeroes it itself.

    ``step`` and ``zero_grad`` do nothing (the engine's ``train_step`` does both, once per global
    batch); ``step_was_skipped`` reports Megatron's ``skipped_iter`` (fp16 overflow).

    Args:
        optimizer: Megatron's optimizer.
    """

    def __init__(self, optimizer: MegatronOptimizer) -> None:
        # AcceleratedOptimizer forwards attribute access to what it wraps; Megatron's optimizer has
        # torch's optimizer interface without being a torch.optim.Optimizer.
        super().__init__(cast(torch.optim.Optimizer, optimizer), device_placement=False, scaler=None)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """No-op: the engine zeroes the gradients in its train step."""

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """No-op: the engine steps the optimizer in its train step."""

    @property
    def step_was_skipped(self) -> bool:
        """Whether the engine's last step was skipped (Megatron's ``skipped_iter``)."""
        return bool(getattr(self.optimizer, "skipped_iter", False))


class MegatronLMSchedulerWrapper(AcceleratedScheduler):
    """The scheduler ``prepare`` returns under Megatron-LM: the engine advances it itself.

    Args:
        scheduler: Megatron's learning-rate scheduler.
        optimizers: the wrapped optimizer(s).
    """

    def __init__(
        self,
        scheduler: OptimizerParamScheduler,
        optimizers: AcceleratedOptimizer | list[AcceleratedOptimizer],
    ) -> None:
        super().__init__(scheduler, optimizers, num_processes=1)

    def step(self, *args: object, **kwargs: object) -> None:
        """No-op: the engine's train step advances the schedule."""


def split_micro_batches(batch_data: Mapping[str, object], num_micro_batches: int) -> list[dict[str, object]]:
    """Cut one global batch (a dict of ``[batch, ...]`` tensors) into ``num_micro_batches`` equal parts.

    Values that are not tensors with a batch dimension are repeated in every part.

    Raises:
        ValueError: the batch size is not a multiple of ``num_micro_batches``.
    """
    sizes = {int(v.shape[0]) for v in batch_data.values() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if not sizes or num_micro_batches == 1:
        return [dict(batch_data)]
    size = max(sizes)
    if size % num_micro_batches:
        raise ValueError(
            f"A batch of {size} samples does not split into num_micro_batches={num_micro_batches}; use "
            "drop_last=True in the DataLoader or a batch size that is a multiple of it"
        )
    step = size // num_micro_batches
    return [
        {
            key: value[i * step : (i + 1) * step]
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size
            else value
            for key, value in batch_data.items()
        }
        for i in range(num_micro_batches)
    ]


def _average_loss_dicts(losses: list[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per key: the mean over micro-batches of scalar losses, the concatenation of other tensors."""
    if not losses:
        return {}
    reduced: dict[str, torch.Tensor] = {}
    for key in losses[0]:
        values = [item[key] for item in losses]
        if torch.as_tensor(values[0]).dim() == 0:
            reduced[key] = _mean(values)
        else:
            reduced[key] = torch.cat(values)
    return reduced


def _mean(values: list[torch.Tensor]) -> torch.Tensor:
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total / len(values)


class MegatronEngine(torch.nn.Module):
    """Megatron-LM's model chunks, optimizer and schedule behind one ``forward`` (train / eval step).

    Args:
        accelerator: the Accelerator (its Megatron-LM plugin chooses the train step).
        model: megatron-core's (DDP-wrapped) model chunks.
        optimizer: megatron-core's optimizer.
        scheduler: megatron-core's ``OptimizerParamScheduler``.

    Raises:
        MegatronLMUnavailableError: megatron-core or CUDA is missing; the message names the
            torch-native alternatives (ParallelismConfig(tp_size=...), PipelineParallelPlugin).
        RuntimeError: Megatron-LM is not initialised (``prepare`` initialises it).
    """

    def __init__(
        self,
        accelerator: MegatronAccelerator,
        model: torch.nn.Module | Sequence[torch.nn.Module],
        optimizer: MegatronOptimizer,
        scheduler: OptimizerParamScheduler,
    ) -> None:
        super().__init__()
        require_megatron_and_cuda("MegatronEngine")
        args = get_args()
        self.module = torch.nn.ModuleList([model] if isinstance(model, torch.nn.Module) else list(model))
        self.base_model = self.module[0]
        self.optimizer = optimizer
        self.scheduler = scheduler
        plugin = accelerator.state.megatron_lm_plugin
        if plugin is None:
            raise RuntimeError("MegatronEngine needs an Accelerator with a MegatronLMPlugin")
        self.train_step_handler: AbstractTrainStep
        if plugin.custom_train_step_class is not None:
            self.train_step_handler = plugin.custom_train_step_class(
                args, **(plugin.custom_train_step_kwargs or {})
            )
        else:
            kind = str(args.model_type_name).lower()
            if kind not in _TRAIN_STEPS:
                raise ValueError(
                    f"No built-in train step for Megatron-LM model type {args.model_type_name!r}: pass "
                    "MegatronLMPlugin(custom_train_step_class=...)"
                )
            self.train_step_handler = _TRAIN_STEPS[kind](accelerator, args)
        # An attribute of ours on megatron-core's optimizer: MegatronLMOptimizerWrapper reads it.
        setattr(self.optimizer, "skipped_iter", False)  # noqa: B010
        self.iteration = 0
        self.eval_total_loss_dict: dict[str, torch.Tensor | float] = {}
        self.module_config = self.get_module_config()
        self.board = TrainingBoard(args)

    def get_module_config(self) -> TransformerConfig:
        """megatron-core's model config, set up for the schedule: loss scaling, no-sync and gradient finalisation.

        Returns:
            The ``TransformerConfig`` of the first chunk, with ``grad_scale_func`` (the optimizer's
            loss scale), ``no_sync_func`` (with overlapped reduction) and ``finalize_model_grads_func``.
        """
        from megatron.core.distributed import (  # type: ignore[import-not-found]
            DistributedDataParallel,
            finalize_model_grads,
        )
        from megatron.core.utils import get_model_config  # type: ignore[import-not-found]

        config = get_model_config(self.module[0])
        config.grad_scale_func = self.optimizer.scale_loss
        first = self.module[0]
        if isinstance(first, DistributedDataParallel) and first.ddp_config.overlap_grad_reduce:
            no_sync = [chunk.no_sync for chunk in self.module]
            config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
        config.finalize_model_grads_func = finalize_model_grads
        return config

    def train(self, mode: bool = True) -> MegatronEngine:
        """Put every model chunk in training mode (``mode=True``) or evaluation mode; returns the engine."""
        for chunk in self.module:
            chunk.train(mode)
        self.training = mode
        return self

    def eval(self) -> MegatronEngine:
        """Put every model chunk in evaluation mode; returns the engine."""
        return self.train(False)

    def get_batch_data_iterator(
        self, batch_data: Mapping[str, object]
    ) -> Iterator[dict[str, object]] | list[Iterator[dict[str, object]] | None] | None:
        """Split a batch into the micro-batch iterator(s) megatron-core's schedule reads.

        Returns:
            One iterator over the micro-batches, one per model chunk under an interleaved schedule,
            or None (per chunk) for an empty batch.
        """
        args = get_args()
        chunks = split_micro_batches(batch_data, int(args.num_micro_batches)) if batch_data else None
        if len(self.module) > 1:
            return [iter(chunks) if chunks is not None else None for _ in self.module]
        return iter(chunks) if chunks is not None else None

    def _run_schedule(
        self, batch_data: Mapping[str, object], forward_only: bool
    ) -> list[Mapping[str, torch.Tensor]]:
        from megatron.core.pipeline_parallel import get_forward_backward_func  # type: ignore[import-not-found]

        args = get_args()
        num_micro = int(args.num_micro_batches)
        sizes = [int(v.shape[0]) for v in batch_data.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
        seq = [int(v.shape[1]) for v in batch_data.values() if isinstance(v, torch.Tensor) and v.dim() > 1]
        return get_forward_backward_func()(
            forward_step_func=self.train_step_handler.forward_step,
            # megatron-core's annotation omits the None its schedules accept (no data on this stage).
            data_iterator=self.get_batch_data_iterator(batch_data),  # pyright: ignore[reportArgumentType]
            model=list(self.module),
            num_microbatches=num_micro,
            seq_length=max(seq) if seq else int(args.seq_length or 0),
            micro_batch_size=(max(sizes) // num_micro) if sizes else int(args.micro_batch_size),
            decoder_seq_length=args.decoder_seq_length,
            forward_only=forward_only,
        )

    def _is_last_stage(self) -> bool:
        from megatron.core import parallel_state as ps  # type: ignore[import-not-found]

        return ps.is_pipeline_last_stage(ignore_virtual=True)

    def train_step(
        self, **batch_data: object
    ) -> tuple[dict[str, torch.Tensor], int, float | None, int | None]:
        """One training step over a global batch: every micro-batch, gradient reduction, optimizer and schedule step.

        Returns:
            ``(loss_dict, skipped_iter, grad_norm, num_zeros_in_grad)``; ``loss_dict`` (losses averaged
            over micro-batches and data-parallel ranks) is empty off the last pipeline stage.
        """
        args = get_args()
        for chunk in self.module:
            # megatron-core's DDP chunks; torch types a Module's attributes as Tensor | Module.
            chunk.zero_grad_buffer()  # pyright: ignore[reportCallIssue]
        self.optimizer.zero_grad()
        losses = self._run_schedule(batch_data, forward_only=False)
        # megatron-core leaves the abstract step unannotated; its optimizers return these three.
        update_successful, grad_norm, num_zeros_in_grad = self.optimizer.step()  # pyright: ignore[reportGeneralTypeIssues]
        if update_successful:
            self.scheduler.step(increment=int(args.global_batch_size))
        setattr(self.optimizer, "skipped_iter", not update_successful)  # noqa: B010
        loss_dict = _average_loss_dicts(losses) if self._is_last_stage() else {}
        return loss_dict, int(not update_successful), grad_norm, num_zeros_in_grad

    def eval_step(self, **batch_data: object) -> dict[str, torch.Tensor]:
        """One evaluation step (forward only) over a global batch.

        Returns:
            The losses averaged over micro-batches (non-scalar outputs concatenated); empty off the
            last pipeline stage.
        """
        with torch.no_grad():
            losses = self._run_schedule(batch_data, forward_only=True)
        return _average_loss_dicts(losses) if self._is_last_stage() else {}

    def _broadcast_from_last_stage(self, loss: torch.Tensor) -> torch.Tensor:
        # Every process of a pipeline gets the loss its last stage computed (as the script reads it).
        from megatron.core import parallel_state as ps  # type: ignore[import-not-found]

        if ps.get_pipeline_model_parallel_world_size() > 1:
            group = ps.get_pipeline_model_parallel_group()
            assert isinstance(group, torch.distributed.ProcessGroup), "one pipeline group per process"
            torch.distributed.broadcast(loss, src=ps.get_pipeline_model_parallel_last_rank(), group=group)
        return loss

    def forward(self, **batch_data: object) -> object:
        """A train step in training mode, an eval step otherwise; returns the summed scalar losses.

        Returns:
            The handler's ``model_output_class(loss=, logits=)`` (e.g. transformers'
            ``CausalLMOutputWithCrossAttentions``) when it has one, else the loss tensor.
        """
        if self.module[0].training:
            loss_dict, _, grad_norm, num_zeros = self.train_step(**batch_data)
            self.iteration += 1
            self.board.train_step(
                self.iteration,
                loss_dict,
                self.optimizer.param_groups[0]["lr"] if self.optimizer.param_groups else None,
                float(self.optimizer.get_loss_scale()),
                grad_norm,
                num_zeros,
            )
        else:
            loss_dict = self.eval_step(**batch_data)
            for key, value in loss_dict.items():
                if torch.as_tensor(value).dim() == 0:
                    self.eval_total_loss_dict[key] = self.eval_total_loss_dict.get(key, 0.0) + value
                    self.eval_total_loss_dict[key + "_num_iters"] = (
                        self.eval_total_loss_dict.get(key + "_num_iters", 0) + 1
                    )
        loss = torch.zeros((), device=torch.cuda.current_device())
        for value in loss_dict.values():
            if torch.as_tensor(value).dim() == 0:
                loss = loss + value
        loss = self._broadcast_from_last_stage(loss.detach().float())
        output_class = getattr(self.train_step_handler, "model_output_class", None)
        if output_class is not None:
            return output_class(loss=loss, logits=loss_dict.get("logits"))
        return loss

    def log_eval_results(self) -> None:
        """Print the evaluation losses (and perplexities) accumulated since the last call, then reset them.

        With ``tensorboard_dir`` they are written to TensorBoard too.
        """
        if not self.eval_total_loss_dict:
            return
        values = {
            key: float(total) / float(self.eval_total_loss_dict[key + "_num_iters"])
            for key, total in self.eval_total_loss_dict.items()
            if not key.endswith("_num_iters")
        }
        parts = [f"validation loss at iteration {self.iteration}"]
        for key, value in values.items():
            parts.append(f"{key} value: {value:.6E} | {key} PPL: {math.exp(min(20.0, value)):.6E}")
        if self._is_last_stage():
            print(" | ".join(parts), flush=True)
        self.board.validation(self.iteration, values)
        self.eval_total_loss_dict = {}

    # ------------------------------------------------------------------ checkpoints
    def _sharded_state_dict(self, is_loading: bool) -> dict[str, object]:
        from megatron.core.utils import unwrap_model  # type: ignore[import-not-found]

        args = get_args()
        state: dict[str, object] = {}
        for index, chunk in enumerate(unwrap_model(list(self.module))):
            state["model" if len(self.module) == 1 else f"model{index}"] = chunk.sharded_state_dict()
        if not (args.no_load_optim if is_loading else args.no_save_optim):
            model_state = {k: v for k, v in state.items() if k.startswith("model")}
            state["optimizer"] = self.optimizer.sharded_state_dict(model_state, is_loading=is_loading)
        state["opt_param_scheduler"] = self.scheduler.state_dict()
        state["iteration"] = self.iteration
        return state

    def save_checkpoint(self, output_dir: str) -> None:
        """Save model, optimizer and schedule with megatron-core's distributed checkpointing.

        Every process writes its shards to ``output_dir/iter_<iteration>``; the main process records
        the iteration in ``latest_checkpointed_iteration.txt`` (Megatron-LM's layout).
        """
        import torch.distributed as dist
        from megatron.core import dist_checkpointing  # type: ignore[import-not-found]

        target = os.path.join(output_dir, f"iter_{self.iteration:07d}")
        if dist.get_rank() == 0:
            os.makedirs(target, exist_ok=True)
        dist.barrier()
        dist_checkpointing.save(self._sharded_state_dict(is_loading=False), target)
        if dist.get_rank() == 0:
            with open(os.path.join(output_dir, _TRACKER_FILE), "w", encoding="utf-8") as tracker:
                tracker.write(str(self.iteration))
        dist.barrier()

    def load_checkpoint(self, input_dir: str) -> None:
        """Load what :meth:`save_checkpoint` wrote into ``input_dir`` (the iteration its tracker names).

        The optimizer state is skipped with the plugin's ``no_load_optim`` (the optimizer's main
        parameters are then refreshed from the loaded weights).

        Raises:
            FileNotFoundError: ``input_dir`` holds no Megatron-LM checkpoint.
            UnsafeCheckpointError: a file needs full unpickling and the caller did not opt in
                (``load_kwargs={"weights_only": False}``); its ``.metadata`` and non-tensor items are
                read weights-only.
        """
        from megatron.core import dist_checkpointing  # type: ignore[import-not-found]
        from megatron.core.utils import unwrap_model  # type: ignore[import-not-found]

        tracker = os.path.join(input_dir, _TRACKER_FILE)
        if not os.path.isfile(tracker):
            raise FileNotFoundError(f"No Megatron-LM checkpoint in {input_dir!r} (no {_TRACKER_FILE})")
        with open(tracker, encoding="utf-8") as handle:
            iteration = int(handle.read().strip())
        source = os.path.join(input_dir, f"iter_{iteration:07d}")

        args = get_args()
        # megatron-core drives torch.distributed.checkpoint with torch's own planner and reader,
        # which would unpickle the .metadata and every non-tensor item fully: weights-only here.
        with weights_only_dcp_reads(source):
            state = dist_checkpointing.load(self._sharded_state_dict(is_loading=True), source)
        assert isinstance(state, dict), "megatron-core's load returns the state dict (strict handling is off)"
        for index, chunk in enumerate(unwrap_model(list(self.module))):
            chunk.load_state_dict(state["model" if len(self.module) == 1 else f"model{index}"], strict=True)
        if args.no_load_optim:
            self.optimizer.reload_model_params()
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["opt_param_scheduler"])
        self.iteration = int(state["iteration"])
