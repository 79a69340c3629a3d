"""Models and helpers shared by the tensor- and pipeline-parallel tests (imported by their workers too)."""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 128


def tiny_llama(seed: int = 0, tied: bool = False) -> torch.nn.Module:
    """A 2-layer Llama from a config (no download); ``tied`` shares the embedding with the LM head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def sgd_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum: linear in the gradients, so rounding in the split matmuls stays at rounding size.

    (Adam divides by tiny second moments and turns rounding noise into 1e-4 steps.) ``foreach=True``:
    its kernels take mixed DTensor / plain parameter lists only through the strategy.
    """
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)


def fresh_accelerator(**kwargs: Any) -> Any:
    """An Accelerator built after resetting the process's shared state (one per test phase)."""
    from accelerando import Accelerator
    from accelerando.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(**kwargs)


class Stack(torch.nn.Module):
    """Four Linear/GELU blocks and a head: the model the pipeline cuts."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()) for _ in range(4)]
        )
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
