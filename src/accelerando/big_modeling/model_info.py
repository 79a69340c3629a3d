"""Questions about what kind of model this is, answered without importing optional libraries."""

from __future__ import annotations

import sys

from torch import nn

__all__ = [
    "RECURRENT_LAYER_TYPES",
    "_refuse_recurrent_layers_under_sequence_parallelism",
    "check_tied_parameters_in_config",
    "is_peft_model",
]

# ``config.layer_types`` values whose layers carry a state along the sequence inside the model's own
# code (not through the attention interface sequence parallelism wraps).
RECURRENT_LAYER_TYPES: frozenset[str] = frozenset({"linear_attention"})


def _class_names(obj: object) -> set[str]:
    return {cls.__name__ for cls in type(obj).__mro__}


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Tell whether a transformers model's configuration asks for tied weights.

    That is: tied input/output embeddings (``config.tie_word_embeddings`` with an output embedding
    layer), a tied encoder and decoder (``is_encoder_decoder`` and ``tie_encoder_decoder``), or a
    submodule defining ``_tie_weights``. Ties declared this way exist even when the weights are not
    shared yet (e.g. a model built on ``meta`` before ``tie_weights()`` ran). Models that are not
    transformers ``PreTrainedModel`` subclasses answer False.

    Args:
        model: the model.

    Returns:
        True when the configuration declares a tie.
    """
    if "PreTrainedModel" not in _class_names(model):
        return False
    config = getattr(model, "config", None)
    word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    if word_embeddings:
        get_output = getattr(model, "get_output_embeddings", None)
        word_embeddings = callable(get_output) and get_output() is not None
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False)) and bool(
        getattr(config, "tie_encoder_decoder", False)
    )
    module_ties = any(hasattr(module, "_tie_weights") for module in model.modules())
    return word_embeddings or encoder_decoder or module_ties


def is_peft_model(model: object) -> bool:
    """Tell whether ``model`` is a PEFT ``PeftModel`` (a base model wrapped with adapters).

    ``peft`` is not imported: when it has not been imported, no ``PeftModel`` can exist.

    Args:
        model: anything.

    Returns:
        True for ``peft.PeftModel`` instances (subclasses included).
    """
    peft = sys.modules.get("peft")
    peft_model = getattr(peft, "PeftModel", None) if peft is not None else None
    if peft_model is None:
        # peft imported partially, or only its submodule: fall back to the class names.
        return "PeftModel" in _class_names(model) and "peft" in sys.modules
    return isinstance(model, peft_model)


def _refuse_recurrent_layers_under_sequence_parallelism(model: object) -> None:
    """Refuse a model whose layers carry a recurrent state along the sequence, before sequence parallelism.

    Sequence parallelism (Ulysses) gathers the whole sequence before attention, so ordinary attention
    layers are unaffected by the sharding. Linear-attention layers are not: they keep a running state
    along the sequence inside the model's own layer code, so every rank would restart that state from
    zero and the gradients would be silently wrong. The layer kinds are read from the (text)
    configuration's ``layer_types``; a model without one is accepted.

    Args:
        model: the model about to be prepared for sequence parallelism.

    Raises:
        ValueError: the configuration lists layer types in :data:`RECURRENT_LAYER_TYPES`.
    """
    config = getattr(model, "config", None)
    get_text_config = getattr(config, "get_text_config", None)
    if callable(get_text_config):
        config = get_text_config()
    layer_types = getattr(config, "layer_types", None) or ()
    refused = sorted({kind for kind in layer_types if kind in RECURRENT_LAYER_TYPES})
    if refused:
        raise ValueError(
            f"Sequence parallelism does not support attention layers of type {refused} "
            f"(model {type(model).__name__}). Those layers carry a recurrent state along the sequence and "
            "bypass the attention interface, so sharding the sequence restarts the state on every rank and "
            "produces wrong gradients without failing. Use a full-attention model, or disable sequence "
            "parallelism."
        )
