"""Where the planner gets a model: a named built-in config, a transformers config, or ``module:factory``.

A :class:`ModelSource` builds the model (the simulator calls it under a ``FakeTensorMode``, so no
weight is ever allocated) and makes a batch of token ids for it. Nothing is downloaded: a model name
is looked up in the local Hugging Face cache only.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

__all__ = ["BUILTIN_CONFIGS", "ModelSource", "resolve_model"]

#: Named configs shipped with the planner: three tiny ones (validation) and Llama-2-7B's shape.
BUILTIN_CONFIGS: dict[str, dict[str, object]] = {
    "tiny-llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    },
    "tiny-gpt2": {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 4,
        "n_head": 4,
        "vocab_size": 512,
        "n_positions": 512,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "tiny-t5": {
        "model_type": "t5",
        "d_model": 64,
        "d_ff": 128,
        "d_kv": 16,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "vocab_size": 512,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
        "eos_token_id": 1,
    },
    "llama-7b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    },
}


_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers")


@dataclass(frozen=True)
class ModelSource:
    """How to build one model and feed it.

    Attributes:
        name: a label for reports.
        build: returns a fresh model (called inside the simulator's fake-tensor mode).
        vocab_size: token ids of a batch are drawn below this.
        seq2seq: the model takes ``labels`` as decoder targets (T5-style) rather than shifted inputs.
        config: the transformers config dict when the model came from one (for the layout rules).
    """

    name: str
    build: Callable[[], torch.nn.Module]
    vocab_size: int
    seq2seq: bool = False
    config: dict[str, object] | None = None

    @property
    def num_layers(self) -> int | None:
        """Transformer layers of a config-built model (None for a ``module:function`` model)."""
        if self.config is None:
            return None
        for key in _LAYER_KEYS:
            value = self.config.get(key)
            if isinstance(value, int):
                return value
        return None

    def with_layers(self, num_layers: int) -> ModelSource:
        """The same model with ``num_layers`` layers (every layer-count key of its config set).

        Raises:
            ValueError: the model does not come from a config.
        """
        if self.config is None:
            raise ValueError(f"{self.name} is built by a function; its layer count cannot be changed")
        data = dict(self.config)
        for key in _LAYER_KEYS:
            if key in data:
                data[key] = num_layers
        return replace(_from_config(self.name, data), name=self.name)

    def batch(self, micro_batch: int, seq_length: int) -> dict[str, torch.Tensor]:
        """A batch of random token ids (inputs and labels) of shape ``(micro_batch, seq_length)``."""
        ids = torch.randint(0, self.vocab_size, (micro_batch, seq_length))
        return {"input_ids": ids, "labels": ids.clone()}


def _from_config(name: str, data: dict[str, object]) -> ModelSource:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    fields = {k: v for k, v in data.items() if k != "model_type"}
    config = AutoConfig.for_model(str(data["model_type"]), **fields)
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    auto = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM

    def build() -> torch.nn.Module:
        return auto.from_config(config, attn_implementation="sdpa")

    return ModelSource(name, build, int(config.vocab_size), seq2seq, dict(data))


def _from_factory(spec: str) -> ModelSource:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"cannot load the model factory {spec!r} ({err}); write module:function, with the module importable "
            "(e.g. run from its folder) and the function returning a torch.nn.Module"
        ) from err
    if not callable(factory):
        raise ValueError(f"{spec!r} is not callable; point at a function returning a torch.nn.Module")
    config = getattr(factory, "config", None)
    vocab = int(getattr(config, "vocab_size", 0) or 32000)

    def build() -> torch.nn.Module:
        model = factory()
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module")
        return model

    return ModelSource(spec, build, vocab)


def resolve_model(spec: str) -> ModelSource:
    """A :class:`ModelSource` from a name the command line accepts.

    Args:
        spec: a built-in name (:data:`BUILTIN_CONFIGS`), a path to a transformers ``config.json`` or the
            folder holding it, ``module:function`` (a function returning the model; it is called inside
            the fake-tensor mode, so it must not load weights from disk), or a model name in the local
            Hugging Face cache.

    Raises:
        ValueError: nothing of that name, or a factory that cannot be imported.
    """
    if spec in BUILTIN_CONFIGS:
        return _from_config(spec, BUILTIN_CONFIGS[spec])
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        data = json.loads(path.read_text())
        if "model_type" not in data:
            raise ValueError(f"{path} has no model_type; give a transformers config.json")
        return _from_config(spec, data)
    if ":" in spec:
        return _from_factory(spec)
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(spec, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"no model {spec!r}: give a built-in name ({', '.join(BUILTIN_CONFIGS)}), a config.json path, "
            "module:function, or a model name already in the local Hugging Face cache (nothing is downloaded)"
        ) from err
    return _from_config(spec, config.to_dict())
