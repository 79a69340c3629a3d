"""Reading a Hugging Face model's architecture into Megatron-LM arguments.

Megatron-LM builds its own copy of a model from architecture arguments (layers, hidden size, heads,
vocabulary, sequence length). One parser per model family (``model.config.model_type``) reads them
from the transformers config and writes them to the plugin's ``megatron_lm_default_args``. The
built-in families are rows of one table (``_ARCHITECTURES``: Megatron-LM argument -> config
attribute); other families register with :func:`add_model_config_to_megatron_parser`. Parsing needs neither Megatron-LM
nor transformers: only the model's ``config`` attributes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, SupportsInt

if TYPE_CHECKING:
    import torch

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


class MegatronArgsHolder(Protocol):
    """What a parser fills: a ``MegatronLMPlugin`` (its Megatron-LM default args and sequence lengths)."""

    megatron_lm_default_args: dict[str, object]
    seq_length: int | None
    encoder_seq_length: int | None
    decoder_seq_length: int | None


#: A family's parser: ``(plugin, model, sample batch or None)``; it fills the plugin's default args.
Parser = Callable[[MegatronArgsHolder, object, "Mapping[str, torch.Tensor] | None"], None]

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
    megatron_lm_plugin: MegatronArgsHolder,
    model: object,
    batch_data: Mapping[str, torch.Tensor] | None = None,
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


def _args(plugin: MegatronArgsHolder) -> dict[str, object]:
    args = getattr(plugin, "megatron_lm_default_args", None)
    if args is None:
        args = {}
        plugin.megatron_lm_default_args = args
    return args


def _batch_width(batch_data: Mapping[str, torch.Tensor] | None, key: str) -> int | None:
    if batch_data is None or key not in batch_data:
        return None
    return int(batch_data[key].shape[1])


def _single_stack_seq_length(
    plugin: MegatronArgsHolder,
    batch_data: Mapping[str, torch.Tensor] | None,
    max_positions: str | SupportsInt,
) -> int:
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


@dataclass(frozen=True)
class _Architecture:
    """How one model family's transformers config maps onto Megatron-LM arguments."""

    megatron_model: str  # Megatron-LM's model_type_name: "bert", "gpt" or "t5"
    kind: Literal["encoder", "decoder", "encoder-decoder"]  # decides how sequence lengths are filled
    # Megatron-LM argument -> config attribute; a missing attribute is an error unless in ``defaults``
    fields: Mapping[str, str]
    defaults: Mapping[str, object] = field(default_factory=dict)  # Megatron-LM argument -> value if missing
    # Megatron-LM argument -> config attribute, copied only when the config sets it (not None)
    optional: Mapping[str, str] = field(default_factory=dict)
    # lower-case part of the model class name that marks a pretraining head; None: always pretraining
    pretraining_head: str | None = None
    tokenizer: str | None = None  # Megatron-LM tokenizer_type of a decoder


_DENSE = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "max_position_embeddings": "max_position_embeddings",
}

_ARCHITECTURES: dict[str, _Architecture] = {
    "bert": _Architecture(
        "bert",
        "encoder",
        {**_DENSE, "num_labels": "num_labels"},
        defaults={"num_labels": 2},
        pretraining_head="maskedlm",
    ),
    "gpt2": _Architecture(
        "gpt",
        "decoder",
        {
            "num_layers": "n_layer",
            "hidden_size": "n_embd",
            "num_attention_heads": "n_head",
            "max_position_embeddings": "n_positions",
        },
        tokenizer="GPT2BPETokenizer",
    ),
    "t5": _Architecture(
        "t5",
        "encoder-decoder",
        {
            "num_layers": "num_layers",
            "hidden_size": "d_model",
            "num_attention_heads": "num_heads",
            "max_position_embeddings": "n_positions",
        },
        defaults={"max_position_embeddings": 1024},
        pretraining_head="conditionalgeneration",
    ),
    "llama": _Architecture("gpt", "decoder", _DENSE, tokenizer="Llama2Tokenizer"),
    "glm4_moe": _Architecture(
        "gpt",
        "decoder",
        _DENSE,
        optional={
            "num_query_groups": "num_key_value_heads",
            "ffn_hidden_size": "intermediate_size",
            "num_experts": "n_routed_experts",
            "moe_router_topk": "num_experts_per_tok",
            "moe_ffn_hidden_size": "moe_intermediate_size",
        },
        tokenizer="HuggingFaceTokenizer",
    ),
}


def _parse(
    family: str, plugin: MegatronArgsHolder, model: object, batch_data: Mapping[str, torch.Tensor] | None
) -> None:
    """Write the architecture arguments of ``model`` (of ``family``) to the plugin's default args.

    Raises:
        AttributeError: the config lacks an attribute the family's table requires.
    """
    architecture = _ARCHITECTURES[family]
    config = getattr(model, "config")  # noqa: B009 - any object with a transformers-style config
    args = _args(plugin)
    args["model_type_name"] = architecture.megatron_model
    for key, attribute in architecture.fields.items():
        if key in architecture.defaults:
            args[key] = getattr(config, attribute, architecture.defaults[key])
        else:
            args[key] = getattr(config, attribute)
    head = architecture.pretraining_head
    args["pretraining_flag"] = head is None or head in type(model).__name__.lower()
    args["orig_vocab_size"] = getattr(config, "vocab_size")  # noqa: B009 - a required config attribute
    args["model_return_dict"] = getattr(config, "return_dict", True)
    for key, attribute in architecture.optional.items():
        value = getattr(config, attribute, None)
        if value is not None:
            args[key] = value
    max_positions = args["max_position_embeddings"]
    if architecture.kind == "encoder-decoder":
        # Encoder and decoder lengths: the plugin's, else the batch's inputs / labels, else the maximum.
        for attribute, key in (("encoder_seq_length", "input_ids"), ("decoder_seq_length", "labels")):
            if getattr(plugin, attribute, None) is None:
                width = _batch_width(batch_data, key)
                setattr(plugin, attribute, width if width is not None else max_positions)
            args[attribute] = getattr(plugin, attribute)
        args["seq_length"] = plugin.encoder_seq_length
        return
    assert isinstance(max_positions, (str, SupportsInt))  # a config size (an int)
    plugin.seq_length = _single_stack_seq_length(plugin, batch_data, max_positions)
    args["seq_length"] = plugin.seq_length
    if architecture.kind == "decoder":
        args["return_logits"] = bool(getattr(plugin, "return_logits", False))
        args["tokenizer_type"] = architecture.tokenizer


@add_model_config_to_megatron_parser("bert")
@add_model_config_to_megatron_parser("megatron-bert")
def parse_bert_config(
    megatron_lm_plugin: MegatronArgsHolder, model: object, batch_data: Mapping[str, torch.Tensor] | None
) -> None:
    """Read a BERT model's architecture (encoder only) into the plugin's Megatron-LM arguments.

    Args:
        megatron_lm_plugin: the plugin to fill.
        model: a transformers BERT model; a masked-LM head turns on pretraining mode.
        batch_data: a sample batch or None.

    Raises:
        AttributeError: the model's config lacks a BERT size attribute.
    """
    _parse("bert", megatron_lm_plugin, model, batch_data)


@add_model_config_to_megatron_parser("gpt2")
def parse_gpt2_config(
    megatron_lm_plugin: MegatronArgsHolder, model: object, batch_data: Mapping[str, torch.Tensor] | None
) -> None:
    """Read a GPT-2 model's architecture (decoder only) into the plugin's Megatron-LM arguments.

    Args:
        megatron_lm_plugin: the plugin to fill.
        model: a transformers GPT-2 model.
        batch_data: a sample batch or None.

    Raises:
        AttributeError: the model's config lacks a GPT-2 size attribute.
    """
    _parse("gpt2", megatron_lm_plugin, model, batch_data)


@add_model_config_to_megatron_parser("t5")
def parse_t5_config(
    megatron_lm_plugin: MegatronArgsHolder, model: object, batch_data: Mapping[str, torch.Tensor] | None
) -> None:
    """Read a T5 model's architecture (encoder-decoder) into the plugin's Megatron-LM arguments.

    Encoder and decoder lengths come from the plugin, else from the batch's ``input_ids`` and
    ``labels``, else from the maximum position count (1024 when the config has none).

    Args:
        megatron_lm_plugin: the plugin to fill.
        model: a transformers T5 model; a conditional-generation head turns on pretraining mode.
        batch_data: a sample batch or None.

    Raises:
        AttributeError: the model's config lacks a T5 size attribute.
    """
    _parse("t5", megatron_lm_plugin, model, batch_data)


@add_model_config_to_megatron_parser("llama")
def parse_llama_config(
    megatron_lm_plugin: MegatronArgsHolder, model: object, batch_data: Mapping[str, torch.Tensor] | None
) -> None:
    """Read a Llama model's architecture (decoder only) into the plugin's Megatron-LM arguments.

    Args:
        megatron_lm_plugin: the plugin to fill.
        model: a transformers Llama model.
        batch_data: a sample batch or None.

    Raises:
        AttributeError: the model's config lacks a Llama size attribute.
    """
    _parse("llama", megatron_lm_plugin, model, batch_data)


@add_model_config_to_megatron_parser("glm4_moe")
def parse_glm4_moe_config(
    megatron_lm_plugin: MegatronArgsHolder, model: object, batch_data: Mapping[str, torch.Tensor] | None
) -> None:
    """Read a GLM-4 mixture-of-experts model's architecture into the plugin's Megatron-LM arguments.

    Besides the dense sizes, the key-value head count, the expert count, experts per token and the
    (expert) feed-forward sizes are read when the config sets them.

    Args:
        megatron_lm_plugin: the plugin to fill.
        model: a transformers GLM-4 MoE model.
        batch_data: a sample batch or None.

    Raises:
        AttributeError: the model's config lacks a dense size attribute.
    """
    _parse("glm4_moe", megatron_lm_plugin, model, batch_data)
