"""megatron-core's GPT / BERT / T5 models built from the Megatron-LM arguments, one pipeline stage at a time.

``build_model(args, config, pre_process, post_process, ...)`` makes the model of one stage (or one
virtual stage) with megatron-core's local layer specs (plain torch modules, no Transformer Engine
needed); :func:`build_model_chunks` calls a provider once per virtual stage of this process.
Construction runs on the CPU with ``use_cpu_initialization``; running the models needs CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = ["build_model", "build_model_chunks"]


def _vocab_and_length(args: SimpleNamespace) -> tuple[int, int]:
    vocab = getattr(args, "padded_vocab_size", None)
    length = args.max_position_embeddings or args.seq_length
    if vocab is None or length is None:
        raise ValueError(
            "The Megatron-LM arguments lack the vocabulary size or the maximum sequence length: prepare a "
            "transformers model whose family has a parser, or set orig_vocab_size and max_position_embeddings "
            "in MegatronLMPlugin(other_megatron_args={...})"
        )
    return int(vocab), int(length)


def _position_embedding_type(args: SimpleNamespace, default: str = "learned_absolute") -> str:
    if getattr(args, "position_embedding_type", None):
        return str(args.position_embedding_type)
    return "rope" if getattr(args, "use_rotary_position_embeddings", False) else default


class _ModelKwargs(TypedDict):
    config: TransformerConfig
    vocab_size: int
    max_sequence_length: int
    pre_process: bool
    post_process: bool
    parallel_output: bool
    share_embeddings_and_output_weights: bool
    # Each megatron-core model accepts its own Literal set of names; the model checks the one given.
    position_embedding_type: Any


def _common_model_kwargs(
    args: SimpleNamespace, config: TransformerConfig, pre: bool, post: bool
) -> _ModelKwargs:
    """The constructor arguments megatron-core's GPT, BERT and T5 models share."""
    vocab, length = _vocab_and_length(args)
    return {
        "config": config,
        "vocab_size": vocab,
        "max_sequence_length": length,
        "pre_process": pre,
        "post_process": post,
        "parallel_output": True,
        "share_embeddings_and_output_weights": True,
        "position_embedding_type": _position_embedding_type(args),
    }


def _gpt(
    args: SimpleNamespace, config: TransformerConfig, pre: bool, post: bool, vp_stage: int | None
) -> MegatronModule:
    from megatron.core.models.gpt import GPTModel  # type: ignore[import-not-found]
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # type: ignore[import-not-found]

    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, normalization=config.normalization)
    kwargs = _common_model_kwargs(args, config, pre, post)
    kwargs["share_embeddings_and_output_weights"] = not getattr(
        args, "untie_embeddings_and_output_weights", False
    )
    return GPTModel(transformer_layer_spec=spec, vp_stage=vp_stage, **kwargs)


def _bert(
    args: SimpleNamespace, config: TransformerConfig, pre: bool, post: bool, vp_stage: int | None
) -> MegatronModule:
    from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec  # type: ignore[import-not-found]
    from megatron.core.models.bert.bert_model import BertModel  # type: ignore[import-not-found]

    if not args.pretraining_flag:
        raise ValueError(
            "megatron-core has no BERT sequence-classification model; for a classification head pass your own "
            "builder as MegatronLMPlugin(custom_model_provider_function=...)"
        )
    return BertModel(
        num_tokentypes=2 if args.bert_binary_head else 0,
        transformer_layer_spec=bert_layer_local_spec,
        add_binary_head=bool(args.bert_binary_head),
        vp_stage=vp_stage,
        **_common_model_kwargs(args, config, pre, post),
    )


def _t5(
    args: SimpleNamespace,
    config: TransformerConfig,
    pre: bool,
    post: bool,
    add_encoder: bool,
    add_decoder: bool,
) -> MegatronModule:
    from megatron.core.models.T5 import t5_spec  # type: ignore[import-not-found]
    from megatron.core.models.T5.t5_model import T5Model  # type: ignore[import-not-found]
    from megatron.core.transformer.transformer_block import (  # type: ignore[import-not-found]
        TransformerBlockSubmodules,
    )

    layers = int(config.num_layers)
    # The local block specs of megatron-core 0.16 put Transformer Engine's norm at the end of each
    # block; the plain torch norm keeps T5 free of Transformer Engine like GPT and BERT.
    encoder = TransformerBlockSubmodules(
        [t5_spec.encoder_model_with_local_spec()] * layers,
        layer_norm=t5_spec.LNImpl,  # pyright: ignore[reportArgumentType]  # megatron builds a class too
    )
    decoder = TransformerBlockSubmodules(
        [t5_spec.decoder_model_with_local_spec()] * layers,
        layer_norm=t5_spec.LNImpl,  # pyright: ignore[reportArgumentType]  # megatron builds a class too
    )
    return T5Model(
        encoder_config=config,
        # megatron-core annotates a ModuleSpec; its own T5 helpers pass block submodules, as here.
        transformer_encoder_layer_spec=encoder,  # pyright: ignore[reportArgumentType]
        transformer_decoder_layer_spec=decoder,  # pyright: ignore[reportArgumentType]
        add_encoder=add_encoder,
        add_decoder=add_decoder,
        **_common_model_kwargs(args, config, pre, post),
    )


def build_model(
    args: SimpleNamespace,
    config: TransformerConfig,
    pre_process: bool = True,
    post_process: bool = True,
    add_encoder: bool = True,
    add_decoder: bool = True,
    vp_stage: int | None = None,
) -> MegatronModule:
    """megatron-core's model of ``args.model_type_name`` (``gpt``, ``bert``, ``t5``) for one pipeline stage.

    Args:
        args: the Megatron-LM arguments (architecture, vocabulary, lengths).
        config: the ``TransformerConfig`` (see ``config.transformer_config``).
        pre_process: this stage holds the embedding.
        post_process: this stage holds the output layer and the loss.
        add_encoder, add_decoder: T5 only: which halves this stage holds.
        vp_stage: the virtual pipeline stage (GPT / BERT under interleaved pipelines).

    Raises:
        ValueError: an unknown model type, BERT classification (megatron-core has no such model),
            T5 under pipeline parallelism, or missing vocabulary / length arguments.
    """
    kind = str(args.model_type_name).lower()
    if kind == "gpt":
        return _gpt(args, config, pre_process, post_process, vp_stage)
    if kind == "bert":
        return _bert(args, config, pre_process, post_process, vp_stage)
    if kind == "t5":
        if int(args.pipeline_model_parallel_size) > 1:
            raise ValueError(
                "T5 under pipeline parallelism is not built by accelerando (megatron-core 0.16 dropped the encoder/"
                "decoder split rank): use pp_degree=1, or pass MegatronLMPlugin(custom_model_provider_function=...)"
            )
        return _t5(args, config, pre_process, post_process, add_encoder, add_decoder)
    raise ValueError(
        f"Megatron-LM model type {args.model_type_name!r} is not built in (gpt, bert, t5): pass "
        "MegatronLMPlugin(custom_model_provider_function=...)"
    )


def build_model_chunks(
    provider: Callable[..., MegatronModule], args: SimpleNamespace
) -> list[MegatronModule]:
    """Call ``provider(pre_process=, post_process=)`` once per (virtual) pipeline stage this process holds.

    With an interleaved schedule (``virtual_pipeline_model_parallel_size``) megatron-core's
    virtual-stage rank is set around each call, so a provider with the reference's signature
    (no ``vp_stage`` argument) still builds the right layers.

    Args:
        provider: the model provider (``model_provider_func`` or the plugin's custom one).
        args: the Megatron-LM arguments.

    Returns:
        The model chunks, in virtual-stage order.
    """
    from megatron.core import parallel_state as ps  # type: ignore[import-not-found]

    vpp = args.virtual_pipeline_model_parallel_size
    if ps.get_pipeline_model_parallel_world_size() == 1 or vpp is None:
        return [provider(pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage())]
    chunks: list[MegatronModule] = []
    for stage in range(int(vpp)):
        ps.set_virtual_pipeline_model_parallel_rank(stage)
        pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage)
        post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)
        chunks.append(provider(pre_process=pre, post_process=post))
    ps.set_virtual_pipeline_model_parallel_rank(0)
    return chunks
