"""Reading a Hugging Face model's architecture into Megatron-LM arguments.

Megatron-LM builds its own copy of a model from architecture arguments (layers, hidden size, heads,
vocabulary, sequence length). One parser per model family (``model.config.model_type``) reads them
from the transformers config and writes them to the plugin's ``megatron_lm_default_args``; new
families register with :func:`add_model_config_to_megatron_parser`. Parsing needs neither Megatron-LM
nor transformers: only the model's ``config`` attributes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "MODEL_CONFIGS_TO_MEGATRON_PARSERS",
    "add_model_config_to_megatron_parser",
    "parse_bert_config",
    "parse_glm4_moe_config",
    "parse_gpt2_config",
    "parse_llama_config",
    "parse_model_config",
    "parse_t5_config",
]

Parser = Callable[[Any, Any, Any], None]

#: ``model_type`` (as in ``model.config.model_type``) -> the parser of that family.
MODEL_CONFIGS_TO_MEGATRON_PARSERS: dict[str, Parser] = {}


def add_model_config_to_megatron_parser(model_type: str) -> Callable[[Parser], Parser]:
    """Register a parser for a model family (used as a decorator).

    Args:
        model_type: the family's ``model.config.model_type`` (``"llama"``).

    Returns:
        A decorator that records the function and returns it unchanged.
    """

    def register(func: Parser) -> Parser:
        MODEL_CONFIGS_TO_MEGATRON_PARSERS[model_type] = func
        return func

    return register


def parse_model_config(
    megatron_lm_plugin: Any, model: Any, batch_data: Mapping[str, Any] | None = None
) -> None:
    """Fill ``megatron_lm_plugin.megatron_lm_default_args`` from ``model``'s config with its family's parser.

    Args:
        megatron_lm_plugin: the Megatron-LM plugin to fill.
        model: a transformers model (anything with a ``config.model_type``).
        batch_data: a sample batch; its ``input_ids`` / ``labels`` widths give the sequence lengths
            when the plugin does not set them.

    Raises:
        ValueError: if the model's family has no parser (the message lists those that have one).
    """
    model_type = str(getattr(getattr(model, "config", None), "model_type", "")).lower()
    parser = MODEL_CONFIGS_TO_MEGATRON_PARSERS.get(model_type)
    if parser is None:
        raise ValueError(
            f"No Megatron-LM parser for model type {model_type!r}; known: {sorted(MODEL_CONFIGS_TO_MEGATRON_PARSERS)}. "
            "Fix: register one with @add_model_config_to_megatron_parser(model_type)."
        )
    parser(megatron_lm_plugin, model, batch_data)


def _args(plugin: Any) -> dict[str, Any]:
    args = getattr(plugin, "megatron_lm_default_args", None)
    if args is None:
        args = {}
        plugin.megatron_lm_default_args = args
    return args


def _batch_width(batch_data: Mapping[str, Any] | None, key: str) -> int | None:
    if batch_data is None or key not in batch_data:
        return None
    return int(batch_data[key].shape[1])


def _decoder_only_seq_length(plugin: Any, batch_data: Mapping[str, Any] | None, max_positions: int) -> int:
    """The sequence length of a decoder-only or encoder-only model: the plugin's, the batch's, or the maximum."""
    own = getattr(plugin, "seq_length", None)
    encoder = getattr(plugin, "encoder_seq_length", None)
    if own is not None and encoder is not None:
        warnings.warn(
            "Both seq_length and encoder_seq_length are set; using encoder_seq_length.", stacklevel=3
        )
    if encoder is not None:
        return int(encoder)
    if own is not None:
        return int(own)
    width = _batch_width(batch_data, "input_ids")
    return width if width is not None else int(max_positions)


def _common(
    plugin: Any,
    model: Any,
    *,
    model_type_name: str,
    num_layers: int,
    hidden_size: int,
    num_attention_heads: int,
    max_position_embeddings: int,
    pretraining_flag: bool,
) -> dict[str, Any]:
    args = _args(plugin)
    args.update(
        model_type_name=model_type_name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        max_position_embeddings=max_position_embeddings,
        pretraining_flag=pretraining_flag,
        orig_vocab_size=model.config.vocab_size,
        model_return_dict=getattr(model.config, "return_dict", True),
    )
    return args


def _causal_lm(plugin: Any, model: Any, batch_data: Any, args: dict[str, Any], tokenizer: str) -> None:
    plugin.seq_length = _decoder_only_seq_length(plugin, batch_data, args["max_position_embeddings"])
    args["seq_length"] = plugin.seq_length
    args["return_logits"] = bool(getattr(plugin, "return_logits", False))
    args["tokenizer_type"] = tokenizer


@add_model_config_to_megatron_parser("bert")
@add_model_config_to_megatron_parser("megatron-bert")
def parse_bert_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Read a BERT model's architecture (encoder only) into the plugin's Megatron-LM arguments.

    Args:
        megatron_lm_plugin: the plugin to fill.
        model: a transformers BERT model; a masked-LM head turns on pretraining mode.
        batch_data: a sample batch or None.
    """
    config = model.config
    args = _common(
        megatron_lm_plugin,
        model,
        model_type_name="bert",
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        pretraining_flag="maskedlm" in type(model).__name__.lower(),
    )
    args["num_labels"] = getattr(config, "num_labels", 2)
    megatron_lm_plugin.seq_length = _decoder_only_seq_length(
        megatron_lm_plugin, batch_data, config.max_position_embeddings
    )
    args["seq_length"] = megatron_lm_plugin.seq_length


@add_model_config_to_megatron_parser("gpt2")
def parse_gpt2_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Read a GPT-2 model's architecture (decoder only) into the plugin's Megatron-LM arguments.

    Args:
        megatron_lm_plugin: the plugin to fill.
        model: a transformers GPT-2 model.
        batch_data: a sample batch or None.
    """
    config = model.config
    args = _common(
        megatron_lm_plugin,
        model,
        model_type_name="gpt",
        num_layers=config.n_layer,
        hidden_size=config.n_embd,
        num_attention_heads=config.n_head,
        max_position_embeddings=config.n_positions,
        pretraining_flag=True,
    )
    _causal_lm(megatron_lm_plugin, model, batch_data, args, "GPT2BPETokenizer")


@add_model_config_to_megatron_parser("t5")
def parse_t5_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Read a T5 model's architecture (encoder-decoder) into the plugin's Megatron-LM arguments.

    Encoder and decoder lengths come from the plugin, else from the batch's ``input_ids`` and
    ``labels``, else from the maximum position count.

    Args:
        megatron_lm_plugin: the plugin to fill.
        model: a transformers T5 model; a conditional-generation head turns on pretraining mode.
        batch_data: a sample batch or None.
    """
    config = model.config
    max_positions = getattr(config, "n_positions", 1024)
    args = _common(
        megatron_lm_plugin,
        model,
        model_type_name="t5",
        num_layers=config.num_layers,
        hidden_size=config.d_model,
        num_attention_heads=config.num_heads,
        max_position_embeddings=max_positions,
        pretraining_flag="conditionalgeneration" in type(model).__name__.lower(),
    )
    for attribute, key in (("encoder_seq_length", "input_ids"), ("decoder_seq_length", "labels")):
        if getattr(megatron_lm_plugin, attribute, None) is None:
            width = _batch_width(batch_data, key)
            setattr(megatron_lm_plugin, attribute, width if width is not None else max_positions)
        args[attribute] = getattr(megatron_lm_plugin, attribute)
    args["seq_length"] = megatron_lm_plugin.encoder_seq_length


@add_model_config_to_megatron_parser("llama")
def parse_llama_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Read a Llama model's architecture (decoder only) into the plugin's Megatron-LM arguments.

    Args:
        megatron_lm_plugin: the plugin to fill.
        model: a transformers Llama model.
        batch_data: a sample batch or None.
    """
    config = model.config
    args = _common(
        megatron_lm_plugin,
        model,
        model_type_name="gpt",
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        pretraining_flag=True,
    )
    _causal_lm(megatron_lm_plugin, model, batch_data, args, "Llama2Tokenizer")


@add_model_config_to_megatron_parser("glm4_moe")
def parse_glm4_moe_config(megatron_lm_plugin: Any, model: Any, batch_data: Any) -> None:
    """Read a GLM-4 mixture-of-experts model's architecture into the plugin's Megatron-LM arguments.

    Besides the dense sizes, the expert count, experts per token and expert hidden size are read.

    Args:
        megatron_lm_plugin: the plugin to fill.
        model: a transformers GLM-4 MoE model.
        batch_data: a sample batch or None.
    """
    config = model.config
    args = _common(
        megatron_lm_plugin,
        model,
        model_type_name="gpt",
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        pretraining_flag=True,
    )
    for key, attribute in (
        ("num_query_groups", "num_key_value_heads"),
        ("ffn_hidden_size", "intermediate_size"),
        ("num_experts", "n_routed_experts"),
        ("moe_router_topk", "num_experts_per_tok"),
        ("moe_ffn_hidden_size", "moe_intermediate_size"),
    ):
        value = getattr(config, attribute, None)
        if value is not None:
            args[key] = value
    _causal_lm(megatron_lm_plugin, model, batch_data, args, "HuggingFaceTokenizer")
