"""A tiny transformer and the training loops shared by the FP8 tests (no transformers import)."""

from __future__ import annotations

import torch

VOCAB, DIM, SEQ = 64, 32, 8


class Block(torch.nn.Module):
    """Pre-norm attention + MLP block whose Linear dimensions are multiples of 16."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(DIM)
        self.q = torch.nn.Linear(DIM, DIM)
        self.k = torch.nn.Linear(DIM, DIM)
        self.v = torch.nn.Linear(DIM, DIM)
        self.o = torch.nn.Linear(DIM, DIM)
        self.norm2 = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, 2 * DIM)
        self.down = torch.nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        att = torch.nn.functional.scaled_dot_product_attention(
            self.q(h), self.k(h), self.v(h), is_causal=True
        )
        x = x + self.o(att)
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class TinyTransformer(torch.nn.Module):
    """Embedding, an entry projection, two blocks, a head: first Linear = ``proj``, last = ``head``."""

    def __init__(self, blocks: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(blocks))
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.proj(self.embed(ids))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_model(seed: int = 0) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer()


def batches(steps: int, world: int = 1, batch: int = 4) -> torch.Tensor:
    return torch.randint(0, VOCAB, (steps * world, batch, SEQ), generator=torch.Generator().manual_seed(1))


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def train(
    model, opt, data, first: int, count: int, backward=None, rank: int = 0, world: int = 1
) -> list[float]:
    losses = []
    for i in range(first, first + count):
        loss = loss_of(model, data[i * world + rank])
        (backward or (lambda value: value.backward()))(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def by_hand(model: torch.nn.Module, all_gather: bool = False) -> torch.nn.Module:
    """The model converted with torchao directly, as the Accelerator converts it on CPU."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from accelerando.backends.precision.fp8.torchao import default_module_filter

    config = Float8LinearConfig(emulate=True, pad_inner_dim=True, enable_fsdp_float8_all_gather=all_gather)
    return convert_to_float8_training(model, module_filter_fn=default_module_filter(model), config=config)
