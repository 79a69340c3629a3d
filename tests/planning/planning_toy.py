"""A small model for the planner's tests: embedding, blocks of two linear layers, a head; no transformers."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from accelerando.backends.planning.models import ModelSource

__all__ = ["Block", "ToyLM", "toy_model", "toy_source"]

VOCAB = 64
WIDTH = 32


class Block(torch.nn.Module):
    """One residual MLP block (the FSDP unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x + down(gelu(up(x)))."""
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class ToyLM(torch.nn.Module):
    """Token ids -> logits; returns the mean cross-entropy against ``labels``."""

    _no_split_modules = ["Block"]

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of one batch."""
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return torch.nn.functional.cross_entropy(self.head(x).flatten(0, 1), labels.flatten())


def toy_source(layers: int = 2) -> ModelSource:
    """A ModelSource building :class:`ToyLM`."""
    return ModelSource(f"toy{layers}", lambda: ToyLM(layers), VOCAB)


def toy_model() -> ToyLM:
    """A two-block :class:`ToyLM` (the ``planning_toy:toy_model`` factory of the command-line tests)."""
    return ToyLM()


# The planner reads a factory's ``config.vocab_size`` to draw token ids below it.
toy_model.config = SimpleNamespace(vocab_size=VOCAB)  # type: ignore[attr-defined]
