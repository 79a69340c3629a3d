"""The Megatron-LM architecture parsers read real transformers configs through their field tables."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from accelerando.plugins import megatron_parsers as mp

transformers = pytest.importorskip("transformers")


def _model(class_name: str, config: object) -> object:
    model = type(class_name, (), {})()  # only the class name and ``config`` are read
    model.config = config
    return model


def _parse(model: object, batch: dict | None = None, **plugin: object) -> tuple[dict, SimpleNamespace]:
    holder = SimpleNamespace(**plugin)
    mp.parse_model_config(holder, model, batch)
    return holder.megatron_lm_default_args, holder


def test_every_table_row_has_its_public_parser_registered():
    for family in mp._ARCHITECTURES:
        parser = mp.MODEL_CONFIGS_TO_MEGATRON_PARSERS[family]
        assert parser is getattr(mp, f"parse_{family}_config")
        assert parser.__doc__
    assert mp.MODEL_CONFIGS_TO_MEGATRON_PARSERS["megatron-bert"] is mp.parse_bert_config


def test_bert_encoder():
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=16, num_attention_heads=2, max_position_embeddings=40, vocab_size=30
    )
    args, plugin = _parse(_model("BertForMaskedLM", config), {"input_ids": torch.zeros(2, 12)})
    assert args["model_type_name"] == "bert" and args["pretraining_flag"] is True
    assert (args["num_layers"], args["hidden_size"], args["num_attention_heads"]) == (2, 16, 2)
    assert (args["max_position_embeddings"], args["orig_vocab_size"], args["num_labels"]) == (40, 30, 2)
    assert args["seq_length"] == plugin.seq_length == 12
    assert "tokenizer_type" not in args and "return_logits" not in args
    args, _ = _parse(_model("BertForSequenceClassification", config))
    assert args["pretraining_flag"] is False and args["seq_length"] == 40


def test_t5_encoder_decoder_lengths():
    config = transformers.T5Config(num_layers=2, d_model=16, num_heads=2, vocab_size=30)
    batch = {"input_ids": torch.zeros(2, 12), "labels": torch.zeros(2, 5)}
    args, plugin = _parse(_model("T5ForConditionalGeneration", config), batch)
    assert args["model_type_name"] == "t5" and args["pretraining_flag"] is True
    assert (args["num_layers"], args["hidden_size"], args["num_attention_heads"]) == (2, 16, 2)
    assert args["max_position_embeddings"] == 1024  # T5 configs have no position limit
    assert (args["encoder_seq_length"], args["decoder_seq_length"], args["seq_length"]) == (12, 5, 12)
    args, plugin = _parse(_model("T5Model", config), None, decoder_seq_length=7)
    assert args["pretraining_flag"] is False
    assert (plugin.encoder_seq_length, plugin.decoder_seq_length) == (1024, 7)


def test_llama_decoder():
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=16, num_attention_heads=2, max_position_embeddings=64, vocab_size=30
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args, _ = _parse(_model("LlamaForCausalLM", config), None, seq_length=8, encoder_seq_length=9)
    assert any("encoder_seq_length" in str(w.message) for w in caught)
    assert args["model_type_name"] == "gpt" and args["pretraining_flag"] is True
    assert args["tokenizer_type"] == "Llama2Tokenizer" and args["return_logits"] is False
    assert args["seq_length"] == 9


def test_glm4_moe_reads_the_expert_sizes():
    config = transformers.Glm4MoeConfig(
        num_hidden_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        moe_intermediate_size=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        vocab_size=30,
    )
    args, _ = _parse(_model("Glm4MoeForCausalLM", config), None, return_logits=True)
    assert (args["num_query_groups"], args["ffn_hidden_size"]) == (1, 32)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"]) == (4, 2, 8)
    assert args["tokenizer_type"] == "HuggingFaceTokenizer" and args["return_logits"] is True


def test_a_missing_size_attribute_is_an_error():
    config = SimpleNamespace(model_type="gpt2", n_layer=2, n_embd=8, vocab_size=10)  # no n_head
    with pytest.raises(AttributeError, match="n_head"):
        _parse(_model("GPT2LMHeadModel", config))
