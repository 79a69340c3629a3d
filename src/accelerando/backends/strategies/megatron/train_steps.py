"""Megatron-LM train steps (GPT, BERT, T5), the dummy scheduler and dataloader, and loss averaging.

The batch, loss and forward-step functions of the train steps are plain torch: they turn a batch of
Hugging Face style tensors (``input_ids``, ``attention_mask``, ``labels`` ...) into the inputs a
Megatron model takes, and reduce its per-token losses; with ``megatron_dataset_flag=True`` they read
Megatron-LM's own sample format instead. Only building Megatron's data iterators needs megatron-core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.nn.functional as F

import accelerando.state
from accelerando.backends.strategies.megatron.args import get_args
from accelerando.backends.strategies.megatron.parallel import avg_losses_across_data_parallel_group
from accelerando.backends.strategies.megatron.requirements import (
    MEGATRON_ALTERNATIVES,
    MegatronLMUnavailableError,
    require_megatron_and_cuda,
)

if TYPE_CHECKING:
    from accelerando.backends.strategies.megatron.holder import MegatronAccelerator
    from accelerando.plugins.megatron import MegatronLMPlugin

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "T5TrainStep",
    "get_ltor_masks_and_position_ids",
]

#: One batch as the data iterators give it: Hugging Face (or Megatron-LM) field name -> tensor.
Batch = Mapping[str, torch.Tensor]
#: A train step's ``(loss, {name: data-parallel average})``.
LossResult = tuple[torch.Tensor, dict[str, torch.Tensor]]
_T = TypeVar("_T")


def _megatron_plugin(accelerator: MegatronAccelerator | None) -> MegatronLMPlugin:
    """The Megatron-LM plugin of ``accelerator`` (or of the process state when None)."""
    if accelerator is None:
        # The reference's public train-step classes may be built without an Accelerator, reading the
        # process state; this is that API, not a strategy reading global state.

        state: object = accelerando.state.AcceleratorState()
    else:
        state = accelerator.state
    plugin: MegatronLMPlugin | None = getattr(state, "megatron_lm_plugin", None)
    if plugin is None:
        raise RuntimeError(
            "No Megatron-LM plugin is set: create the Accelerator with megatron_lm_plugin=MegatronLMPlugin(...) "
            "or launch with --use_megatron_lm"
        )
    return plugin


class MegatronLMDummyScheduler:
    """Stands for the learning-rate schedule Megatron-LM builds itself from the plugin's arguments.

    ``prepare`` reads ``total_num_steps`` and ``warmup_num_steps`` from it (through
    ``MegatronLMPlugin.set_scheduler_args``); it never steps anything itself.

    Args:
        optimizer: the optimizer the schedule belongs to.
        total_num_steps: total training steps (becomes ``train_iters``).
        warmup_num_steps: warm-up steps (becomes ``lr_warmup_iters``).
        kwargs: further schedule arguments, kept in ``kwargs``.
    """

    def __init__(
        self,
        optimizer: object,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        **kwargs: object,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs


class MegatronLMDummyDataLoader:
    """Stands for a dataloader over Megatron-LM's indexed datasets; Megatron-LM builds the real one.

    Args:
        dataset_kwargs: Megatron-LM data arguments (``data_path``, ``splits_string``, ``seq_length``,
            ...), kept in ``dataset_args`` with ``megatron_dataset_flag=True``.
    """

    def __init__(self, **dataset_kwargs: object) -> None:
        self.dataset_args: dict[str, object] = dict(dataset_kwargs)
        self.dataset_args["megatron_dataset_flag"] = True

    def set_megatron_data_args(self) -> None:
        """Copy the data arguments into the active Megatron-LM plugin's arguments.

        A single ``data_path`` string becomes a one-element list (Megatron-LM takes a list).

        Raises:
            RuntimeError: no Megatron-LM plugin is configured in the process state.
        """
        plugin = _megatron_plugin(None)
        for key, value in self.dataset_args.items():
            if key == "data_path" and isinstance(value, str):
                value = [value]
            plugin.megatron_lm_default_args[key] = value
        plugin.megatron_dataset_flag = True
        seq_length = self.dataset_args.get("seq_length")
        if isinstance(seq_length, int):
            plugin.seq_length = seq_length

    def get_train_valid_test_datasets_provider(
        self, accelerator: MegatronAccelerator | None
    ) -> Callable[..., object]:
        """The function that builds the train / valid / test datasets.

        The plugin's ``custom_megatron_datasets_provider_function``: it is called with the sample
        counts ``[train, valid, test]`` and returns the three datasets (None for a missing split).

        Raises:
            RuntimeError: no Megatron-LM plugin is configured.
            MegatronLMUnavailableError: no custom provider: Megatron-LM's own indexed-dataset
                builder needs its tokenizers and compiled data helpers, outside megatron-core.
        """
        plugin = _megatron_plugin(accelerator)
        if plugin.custom_megatron_datasets_provider_function is not None:
            return plugin.custom_megatron_datasets_provider_function
        raise MegatronLMUnavailableError(
            "Building Megatron-LM's indexed datasets (MegatronLMDummyDataLoader) needs Megatron-LM's tokenizers and "
            "compiled dataset helpers, which megatron-core does not ship and accelerando does not drive: pass "
            "MegatronLMPlugin(custom_megatron_datasets_provider_function=...) or prepare a torch DataLoader. "
            f"Without megatron-core and CUDA, use the {MEGATRON_ALTERNATIVES}."
        )

    def build_train_valid_test_data_iterators(
        self, accelerator: MegatronAccelerator | None
    ) -> tuple[Iterator[object] | None, Iterator[object] | None, Iterator[object] | None]:
        """Build the train / valid / test iterators over the provider's datasets.

        Sample counts follow Megatron-LM: ``train_samples`` (or ``train_iters * global_batch_size``),
        ``(train_iters // eval_interval + 1) * eval_iters * global_batch_size`` and
        ``eval_iters * global_batch_size``. Each dataset is read in order, sharded over megatron-core's
        data-parallel group, one step (every micro-batch) per batch, after skipping the plugin's
        ``consumed_samples`` (train, valid, test).

        Raises:
            MegatronLMUnavailableError: megatron-core or CUDA is missing, or no custom provider.
            RuntimeError: Megatron-LM is not initialised (``prepare`` does it).
        """
        require_megatron_and_cuda("MegatronLMDummyDataLoader.build_train_valid_test_data_iterators")
        provider = self.get_train_valid_test_datasets_provider(accelerator)
        return _dataset_iterators(provider)


def _dataset_iterators(
    provider: Callable[..., object],
) -> tuple[Iterator[object] | None, Iterator[object] | None, Iterator[object] | None]:
    from megatron.core import parallel_state as ps  # type: ignore[import-not-found]
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    args = get_args()
    gbs = int(args.global_batch_size)
    train_iters = int(args.train_iters or 0)
    train = int(args.train_samples) if args.train_samples is not None else train_iters * gbs
    evals = (train_iters // int(args.eval_interval) + 1) * int(args.eval_iters)
    datasets = provider([train, evals * gbs, int(args.eval_iters) * gbs])
    if not isinstance(datasets, Iterable):
        raise TypeError(
            f"custom_megatron_datasets_provider_function returned a {type(datasets).__name__}, not the "
            "(train, valid, test) datasets"
        )
    consumed = list(args.consumed_samples or [0, 0, 0])
    iterators: list[Iterator[object] | None] = []
    for split, dataset in enumerate(datasets):
        if dataset is None:
            iterators.append(None)
            continue
        sampler = DistributedSampler(
            dataset,
            num_replicas=ps.get_data_parallel_world_size(),
            rank=ps.get_data_parallel_rank(),
            shuffle=False,
        )
        batch = int(args.micro_batch_size) * int(args.num_micro_batches)
        iterator = iter(DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True))
        # Resuming: the samples already consumed (over all data-parallel ranks) are skipped, whole steps at a time.
        for _ in range(int(consumed[split]) // gbs):
            next(iterator, None)
        iterators.append(iterator)
    return iterators[0], iterators[1], iterators[2]


def get_ltor_masks_and_position_ids(
    tokens: torch.Tensor,
    eod_token: int | None,
    reset_position_ids: bool = False,
    reset_attention_mask: bool = False,
    eod_mask_loss: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-to-right (causal) attention mask, loss mask and position ids for a ``[batch, seq]`` batch.

    Args:
        tokens: the input tokens.
        eod_token: the end-of-document id (None: no document boundaries).
        reset_position_ids: restart positions at 0 after each end-of-document token.
        reset_attention_mask: forbid attention across document boundaries.
        eod_mask_loss: give end-of-document tokens zero loss weight.

    Returns:
        ``(attention_mask, loss_mask, position_ids)``: the mask is ``[b or 1, 1, s, s]`` booleans,
        True where attention is *forbidden* (Megatron's convention).
    """
    batch, seq = tokens.shape
    per_sample = reset_attention_mask and eod_token is not None
    allowed = torch.tril(torch.ones((batch if per_sample else 1, seq, seq), device=tokens.device))
    loss_mask = torch.ones(tokens.shape, dtype=torch.float, device=tokens.device)
    if eod_mask_loss and eod_token is not None:
        loss_mask[tokens == eod_token] = 0.0
    position_ids = torch.arange(seq, dtype=torch.long, device=tokens.device).unsqueeze(0).repeat(batch, 1)
    if eod_token is not None and (reset_position_ids or reset_attention_mask):
        for b in range(batch):
            start = 0
            for index in (tokens[b] == eod_token).nonzero().flatten().tolist():
                if reset_attention_mask:
                    allowed[b, index + 1 :, : index + 1] = 0
                if reset_position_ids:
                    position_ids[b, index + 1 :] -= index + 1 - start
                start = index + 1
    return (allowed.unsqueeze(1) < 0.5), loss_mask, position_ids


def _next_batch(data_iterator: Iterator[Batch] | None) -> Batch:
    if data_iterator is None:
        # What reading fields of the missing batch raised before: a train step needs its data.
        raise TypeError("this Megatron-LM train step reads a batch, but its data iterator is None")
    return next(data_iterator)


def _masked_mean(losses: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    mask = loss_mask.reshape(-1).float()
    return torch.sum(losses.float().reshape(-1) * mask) / mask.sum()


class AbstractTrainStep:
    """Base of the Megatron-LM train steps: a batch function, a loss function and a forward step.

    Args:
        name: the step's name (``"GPTTrainStep"`` ...).
    """

    #: The ``(data_iterator, model) -> (output, loss_fn)`` step megatron-core's schedule calls (set by subclasses).
    forward_step: Callable[..., tuple[object, Callable[..., LossResult]]]

    def __init__(self, name: str) -> None:
        self.name = name
        # What the engine returns from a step: a transformers output class built with (loss=, logits=), or None.
        self.model_output_class: Callable[..., object] | None = None

    def get_batch_func(
        self, accelerator: MegatronAccelerator | None, megatron_dataset_flag: bool
    ) -> Callable[[Iterator[Batch] | None], tuple[torch.Tensor | None, ...]]:
        """The function turning a data iterator into model inputs. Raises NotImplementedError here."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_batch_func")

    def get_forward_step_func(self) -> Callable[..., tuple[object, Callable[..., LossResult]]]:
        """The ``(data_iterator, model) -> (output, loss_fn)`` step. Raises NotImplementedError here."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_forward_step_func")

    def get_loss_func(self, accelerator: MegatronAccelerator | None) -> Callable[..., LossResult]:
        """The function reducing the model's output to a loss. Raises NotImplementedError here."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_loss_func")


def _b1ss(mask: torch.Tensor) -> torch.Tensor:
    """A ``[b, sq, sk]`` mask as ``[b, 1, sq, sk]``: megatron-core's local attention broadcasts over the head dim."""
    return mask.unsqueeze(1) if mask.dim() == 3 else mask


def _output_class(args: object, name: str) -> Callable[..., object] | None:
    """Transformers' output class ``name`` when the model returned dicts (``model_return_dict``), else None."""
    if not getattr(args, "model_return_dict", False):
        return None
    try:
        from transformers import modeling_outputs
    except ImportError:
        return None
    return getattr(modeling_outputs, name, None)


def _custom_or(plugin_value: _T | None, built: Callable[[], _T]) -> _T:
    return plugin_value if plugin_value is not None else built()


def _plugin_of(accelerator: MegatronAccelerator | None) -> MegatronLMPlugin | None:
    return getattr(accelerator.state, "megatron_lm_plugin", None) if accelerator is not None else None


class GPTTrainStep(AbstractTrainStep):
    """Train step of GPT-style (decoder-only) models: next-token loss under a causal mask.

    Args:
        accelerator: the Accelerator (its Megatron-LM plugin may supply custom batch / loss functions).
        args: Megatron-LM arguments (a namespace): ``megatron_dataset_flag``, optional ``eod_token``,
            ``reset_position_ids``, ``reset_attention_mask``, ``eod_mask_loss``, ``return_logits``
            (also return the logits: the engine's output then carries them).
    """

    def __init__(self, accelerator: MegatronAccelerator | None, args: object) -> None:
        super().__init__("GPTTrainStep")
        self.model_output_class = _output_class(args, "CausalLMOutputWithCrossAttentions")
        plugin = _plugin_of(accelerator)
        self.eod_token = getattr(args, "eod_token", None)
        self.reset_position_ids = bool(getattr(args, "reset_position_ids", False))
        self.reset_attention_mask = bool(getattr(args, "reset_attention_mask", False))
        self.eod_mask_loss = bool(getattr(args, "eod_mask_loss", False))
        self.return_logits = bool(getattr(args, "return_logits", False))
        flag = bool(getattr(args, "megatron_dataset_flag", False))
        self.get_batch = _custom_or(
            getattr(plugin, "custom_get_batch_function", None), lambda: self.get_batch_func(accelerator, flag)
        )
        self.loss_func = _custom_or(
            getattr(plugin, "custom_loss_function", None), lambda: self.get_loss_func(accelerator)
        )
        self.forward_step = self.get_forward_step_func()

    def get_batch_func(
        self, accelerator: MegatronAccelerator | None, megatron_dataset_flag: bool
    ) -> Callable[[Iterator[Batch] | None], tuple[torch.Tensor, ...]]:
        """``data_iterator -> (tokens, labels, loss_mask, attention_mask, position_ids)``.

        Labels are ``input_ids`` shifted left by one; the inputs drop the last token. With
        ``megatron_dataset_flag`` the samples are Megatron-LM's: ``text`` (shifted the same way) or
        megatron-core ``GPTDataset``'s ``tokens`` / ``labels`` / ``loss_mask`` / ``position_ids``.
        """

        def get_batch(data_iterator: Iterator[Batch] | None) -> tuple[torch.Tensor, ...]:
            data = _next_batch(data_iterator)
            if megatron_dataset_flag and "tokens" in data:  # megatron-core's GPTDataset samples
                tokens, labels = data["tokens"].long(), data["labels"].long()
                attention_mask, loss_mask, position_ids = get_ltor_masks_and_position_ids(
                    tokens,
                    self.eod_token,
                    self.reset_position_ids,
                    self.reset_attention_mask,
                    self.eod_mask_loss,
                )
                loss_mask = data.get("loss_mask", loss_mask).float()
                position_ids = data.get("position_ids", position_ids).long()
                return tokens, labels, loss_mask, attention_mask, position_ids
            ids = (data["text"] if megatron_dataset_flag else data["input_ids"]).long()
            tokens, labels = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
            attention_mask, loss_mask, position_ids = get_ltor_masks_and_position_ids(
                tokens, self.eod_token, self.reset_position_ids, self.reset_attention_mask, self.eod_mask_loss
            )
            return tokens, labels, loss_mask, attention_mask, position_ids

        return get_batch

    def get_loss_func(self, accelerator: MegatronAccelerator | None) -> Callable[..., LossResult]:
        """``(loss_mask, output_tensor) -> (loss, {"lm loss": data-parallel average})``."""

        def loss_func(
            loss_mask: torch.Tensor, output_tensor: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
        ) -> LossResult:
            logits = None
            if isinstance(output_tensor, tuple):  # return_logits: (per-token losses, logits)
                output_tensor, logits = output_tensor
            loss = _masked_mean(output_tensor, loss_mask)
            reduced = {"lm loss": avg_losses_across_data_parallel_group([loss])[0]}
            if logits is not None:
                reduced["logits"] = logits
            return loss, reduced

        return loss_func

    def get_forward_step_func(self) -> Callable[..., tuple[object, Callable[..., LossResult]]]:
        """``(data_iterator, model) -> (output, loss_fn)``; calls ``model(tokens, position_ids, mask, labels=)``.

        With ``return_logits`` the last stage computes the logits, then the per-token losses from
        them, and hands both on (the logits gathered over the tensor-parallel ranks, detached).
        """

        def forward_step(
            data_iterator: Iterator[Batch] | None, model: torch.nn.Module
        ) -> tuple[object, Callable[..., LossResult]]:
            tokens, labels, loss_mask, attention_mask, position_ids = self.get_batch(data_iterator)
            if not self.return_logits:
                output = model(tokens, position_ids, attention_mask, labels=labels)
                return output, partial(self.loss_func, loss_mask)
            return _with_logits(model(tokens, position_ids, attention_mask), model, labels), partial(
                self.loss_func, loss_mask
            )

        return forward_step


def _with_logits(
    output: torch.Tensor, model: torch.nn.Module, labels: torch.Tensor
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """On the last pipeline stage: ``(per-token losses, full-vocabulary logits)`` from the ``[b, s, v/tp]`` logits."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel  # type: ignore[import-not-found]
    from megatron.core.utils import unwrap_model  # type: ignore[import-not-found]

    if not getattr(unwrap_model(model), "post_process", True):
        return output  # hidden states for the next stage
    # Copied first: megatron-core's vocabulary-parallel cross entropy shifts its input in place.
    logits = output.detach().clone()
    losses = tensor_parallel.vocab_parallel_cross_entropy(output.float(), labels)
    group = parallel_state.get_tensor_model_parallel_group()
    assert isinstance(group, dist.ProcessGroup), "megatron-core's tensor-parallel group is initialised"
    size = dist.get_world_size(group=group)
    if size > 1:
        parts = [torch.empty_like(logits) for _ in range(size)]
        dist.all_gather(parts, logits.contiguous(), group=group)
        logits = torch.cat(parts, dim=-1)
    return losses, logits


class BertTrainStep(AbstractTrainStep):
    """Train step of BERT models: masked-LM (+ sentence-order) pretraining, or sequence classification.

    Args:
        accelerator: the Accelerator.
        args: Megatron-LM arguments: ``megatron_dataset_flag``, ``pretraining_flag`` (default True),
            ``bert_binary_head`` (default True), ``num_labels`` (classification, default 2).
    """

    def __init__(self, accelerator: MegatronAccelerator | None, args: object) -> None:
        super().__init__("BertTrainStep")
        self.model_output_class = _output_class(args, "SequenceClassifierOutput")
        plugin = _plugin_of(accelerator)
        pretraining = bool(getattr(args, "pretraining_flag", True))
        binary_head = bool(getattr(args, "bert_binary_head", True))
        num_labels = int(getattr(args, "num_labels", 2))
        flag = bool(getattr(args, "megatron_dataset_flag", False))
        self.get_batch = _custom_or(
            getattr(plugin, "custom_get_batch_function", None), lambda: self.get_batch_func(accelerator, flag)
        )
        self.loss_func = _custom_or(
            getattr(plugin, "custom_loss_function", None),
            lambda: self.get_loss_func(accelerator, pretraining, num_labels),
        )
        self.forward_step = self.get_forward_step_func(pretraining, binary_head)

    def get_batch_func(
        self, accelerator: MegatronAccelerator | None, megatron_dataset_flag: bool
    ) -> Callable[[Iterator[Batch] | None], tuple[torch.Tensor | None, ...]]:
        """``data_iterator -> (tokens, types, sentence_order, loss_mask, labels, padding_mask)``.

        ``loss_mask`` is 1 where ``labels != -100``; missing ``token_type_ids`` /
        ``next_sentence_label`` give None. With ``megatron_dataset_flag`` the samples are
        Megatron-LM's (``text``, ``types``, ``is_random``, ``loss_mask``, ``labels``, ``padding_mask``).
        """

        def get_batch(data_iterator: Iterator[Batch] | None) -> tuple[torch.Tensor | None, ...]:
            data = _next_batch(data_iterator)
            if megatron_dataset_flag:  # Megatron-LM's BERT samples
                types = data.get("types")
                return (
                    data["text"].long(),
                    types.long() if types is not None else None,
                    data["is_random"].long() if "is_random" in data else None,
                    data["loss_mask"].float(),
                    data["labels"].long(),
                    data["padding_mask"].long(),
                )
            tokens = data["input_ids"].long()
            types = data.get("token_type_ids")
            sentence_order = data.get("next_sentence_label")
            labels = data["labels"].long()
            loss_mask = (labels != -100).float()
            padding_mask = data["attention_mask"].long()
            return tokens, types, sentence_order, loss_mask, labels, padding_mask

        return get_batch

    def get_loss_func(
        self, accelerator: MegatronAccelerator | None, pretraining_flag: bool, num_labels: int
    ) -> Callable[..., LossResult]:
        """The loss: masked-LM mean (+ sentence-order cross entropy) when pretraining, else
        regression (``num_labels == 1``: MSE), single-label (integer labels: cross entropy) or
        multi-label (BCE with logits) classification.
        """

        def pretraining_loss(
            loss_mask: torch.Tensor,
            sentence_order: torch.Tensor | None,
            output_tensor: tuple[torch.Tensor, torch.Tensor | None],
        ) -> LossResult:
            lm_loss_, sop_logits = output_tensor
            lm_loss = _masked_mean(lm_loss_, loss_mask)
            if sop_logits is None or sentence_order is None:  # no sentence-order head or labels
                return lm_loss, {"lm loss": avg_losses_across_data_parallel_group([lm_loss])[0]}
            sop_loss = F.cross_entropy(
                sop_logits.view(-1, 2).float(), sentence_order.view(-1), ignore_index=-1
            )
            averaged = avg_losses_across_data_parallel_group([lm_loss, sop_loss])
            return lm_loss + sop_loss, {"lm loss": averaged[0], "sop loss": averaged[1]}

        def classification_loss(labels: torch.Tensor, logits: torch.Tensor) -> LossResult:
            if num_labels == 1:
                loss = F.mse_loss(logits.view(-1).float(), labels.view(-1).float())
            elif labels.dtype in (torch.long, torch.int):
                loss = F.cross_entropy(logits.view(-1, num_labels).float(), labels.view(-1))
            else:
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
            return loss, {"loss": avg_losses_across_data_parallel_group([loss])[0]}

        return pretraining_loss if pretraining_flag else classification_loss

    def get_forward_step_func(
        self, pretraining_flag: bool, bert_binary_head: bool
    ) -> Callable[..., tuple[object, Callable[..., LossResult]]]:
        """``(data_iterator, model) -> (output, loss_fn)`` for pretraining or classification."""

        def forward_step(
            data_iterator: Iterator[Batch] | None, model: torch.nn.Module
        ) -> tuple[object, Callable[..., LossResult]]:
            tokens, types, sentence_order, loss_mask, labels, padding_mask = self.get_batch(data_iterator)
            if not bert_binary_head:
                types = None
            elif types is None:
                # A model with a binary head has token-type embeddings and needs ids (one segment: all 0).
                types = torch.zeros_like(tokens)
            if pretraining_flag:
                output = model(tokens, padding_mask, tokentype_ids=types, lm_labels=labels)
                return output, partial(self.loss_func, loss_mask, sentence_order)
            output = model(tokens, padding_mask, tokentype_ids=types)
            return output, partial(self.loss_func, labels)

        return forward_step


class T5TrainStep(AbstractTrainStep):
    """Train step of T5 (encoder-decoder) models: encoder, decoder and cross-attention masks.

    Args:
        accelerator: the Accelerator.
        args: Megatron-LM arguments: ``megatron_dataset_flag``; optional ``decoder_start_token_id``
            (default 0) used when a batch has no ``decoder_input_ids``.
    """

    def __init__(self, accelerator: MegatronAccelerator | None, args: object) -> None:
        super().__init__("T5TrainStep")
        self.model_output_class = _output_class(args, "Seq2SeqLMOutput")
        plugin = _plugin_of(accelerator)
        self.decoder_start_token_id = int(getattr(args, "decoder_start_token_id", 0) or 0)
        flag = bool(getattr(args, "megatron_dataset_flag", False))
        self.get_batch = _custom_or(
            getattr(plugin, "custom_get_batch_function", None), lambda: self.get_batch_func(accelerator, flag)
        )
        self.loss_func = _custom_or(
            getattr(plugin, "custom_loss_function", None), lambda: self.get_loss_func(accelerator)
        )
        self.forward_step = self.get_forward_step_func()

    @staticmethod
    def attn_mask_postprocess(attention_mask: torch.Tensor) -> torch.Tensor:
        """``[b, s]`` padding mask (1 = token) -> ``[b, 1, s, s]`` booleans, True where either side is padding."""
        keep = attention_mask.unsqueeze(1) * attention_mask.unsqueeze(2)
        return keep.unsqueeze(1) < 0.5

    @staticmethod
    def get_decoder_mask(seq_length: int, device: torch.device | str | None) -> torch.Tensor:
        """``[1, s, s]`` causal mask of the decoder, True above the diagonal (future positions)."""
        return torch.tril(torch.ones((1, seq_length, seq_length), device=device)) < 0.5

    @staticmethod
    def get_enc_dec_mask(
        attention_mask: torch.Tensor, dec_seq_length: int, device: torch.device | str | None
    ) -> torch.Tensor:
        """``[b, dec_s, enc_s]`` cross-attention mask, True where the encoder position is padding."""
        batch = attention_mask.shape[0]
        decoder_side = torch.ones((batch, dec_seq_length, 1), device=device)
        return (decoder_side * attention_mask.unsqueeze(1)) < 0.5

    def get_batch_func(
        self, accelerator: MegatronAccelerator | None, megatron_dataset_flag: bool
    ) -> Callable[[Iterator[Batch] | None], tuple[torch.Tensor, ...]]:
        """``data_iterator -> (tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask)``.

        Without ``decoder_input_ids`` the decoder reads the labels shifted right (start token first,
        ``-100`` replaced by 0). With ``megatron_dataset_flag`` the samples are Megatron-LM's
        (``text_enc``, ``text_dec``, ``labels``, ``loss_mask`` and the three masks). The three masks
        come back ``[b or 1, 1, sq, sk]``, True where attention is forbidden.
        """

        def get_batch(data_iterator: Iterator[Batch] | None) -> tuple[torch.Tensor, ...]:
            data = _next_batch(data_iterator)
            if megatron_dataset_flag:  # Megatron-LM's T5 samples: masks hold 1 where attention is allowed
                return (
                    data["text_enc"].long(),
                    data["text_dec"].long(),
                    data["labels"].long(),
                    data["loss_mask"].float(),
                    _b1ss(data["enc_mask"] < 0.5),
                    _b1ss(data["dec_mask"] < 0.5),
                    _b1ss(data["enc_dec_mask"] < 0.5),
                )
            tokens_enc = data["input_ids"].long()
            labels = data["labels"].long()
            tokens_dec = data.get("decoder_input_ids")
            if tokens_dec is None:
                tokens_dec = torch.full_like(labels, self.decoder_start_token_id)
                tokens_dec[:, 1:] = labels[:, :-1].clamp(min=0)
            tokens_dec = tokens_dec.long()
            loss_mask = (labels != -100).float()
            device = tokens_enc.device
            enc_mask = self.attn_mask_postprocess(data["attention_mask"])
            dec_mask = _b1ss(self.get_decoder_mask(tokens_dec.shape[1], device))
            enc_dec_mask = _b1ss(self.get_enc_dec_mask(data["attention_mask"], tokens_dec.shape[1], device))
            return tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask

        return get_batch

    def get_loss_func(self, accelerator: MegatronAccelerator | None) -> Callable[..., LossResult]:
        """``(loss_mask, output_tensor) -> (loss, {"loss": data-parallel average})``."""

        def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> LossResult:
            loss = _masked_mean(output_tensor, loss_mask)
            return loss, {"loss": avg_losses_across_data_parallel_group([loss])[0]}

        return loss_func

    def get_forward_step_func(self) -> Callable[..., tuple[object, Callable[..., LossResult]]]:
        """``(data_iterator, model) -> (output, loss_fn)``; the model gets both token streams and the three masks."""

        def forward_step(
            data_iterator: Iterator[Batch] | None, model: torch.nn.Module
        ) -> tuple[object, Callable[..., LossResult]]:
            tokens_enc, tokens_dec, labels, loss_mask, enc_mask, dec_mask, enc_dec_mask = self.get_batch(
                data_iterator
            )
            output = model(tokens_enc, tokens_dec, enc_mask, dec_mask, enc_dec_mask, lm_labels=labels)
            return output, partial(self.loss_func, loss_mask)

        return forward_step
