"""Shared pieces of the parallelism benchmarks: a Llama-style model, hand-written TP / PP, measurements.

Nothing here touches accelerando except :func:`fresh_accelerator`; the hand-written variants use
torch only (``parallelize_module``, ``torch.distributed.pipelining``), so that a benchmark can time
the Accelerator against the same parallelism written directly.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = [
    "LlamaStyle",
    "bytes_held",
    "causal_lm_loss",
    "fresh_accelerator",
    "hand_pipeline_stage",
    "hand_tp_plan",
    "median_ms",
    "pipeline_params_held",
    "step_peak_bytes",
    "timed",
]


class _RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class _Attention(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, seq: int) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.q_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.k_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.v_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.o_proj = torch.nn.Linear(hidden, hidden, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(seq).float(), inv)
        angles = torch.cat((angles, angles), dim=-1)
        # Each block keeps its own rotary tables, so a pipeline stage needs nothing from another.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads / tp of them.
        q, k, v = (
            p(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        cos, sin = self.cos[:s], self.sin[:s]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class _MLP(torch.nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = torch.nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Block(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, seq: int) -> None:
        super().__init__()
        self.input_layernorm = _RMSNorm(hidden)
        self.self_attn = _Attention(hidden, heads, seq)
        self.post_attention_layernorm = _RMSNorm(hidden)
        self.mlp = _MLP(hidden, intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaStyle(torch.nn.Module):
    """A decoder-only transformer laid out like transformers' Llama (names included), in plain torch.

    ``forward(input_ids) -> logits``: one tensor in, one out, no cache objects, so that the same
    model traces into pipeline stages (torch.export) and splits for tensor parallelism. It declares
    its tensor-parallel plan as ``tp_plan`` (the attribute transformers models carry), which the
    Accelerator reads with ``ParallelismConfig(tp_size=...)``.

    Raises:
        ValueError: ``hidden`` not divisible by ``heads``.
    """

    tp_plan: dict[str, str] = {
        "embed_tokens": "embedding_rowwise",
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
        "lm_head": "colwise_rep",
    }

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
        self.embed_tokens = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList([_Block(hidden, heads, hidden * 2, seq) for _ in range(layers)])
        self.norm = _RMSNorm(hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def causal_lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross entropy of ``[batch, seq, vocab]`` logits against ``[batch, seq]`` token ids."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def hand_tp_plan(model: LlamaStyle) -> dict[str, Any]:
    """:attr:`LlamaStyle.tp_plan` written out as torch ``ParallelStyle`` objects, one per module."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {"embed_tokens": RowwiseParallel(input_layouts=Replicate())}
    for i in range(len(model.layers)):
        for name in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
        ):
            plan[f"layers.{i}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"layers.{i}.{name}"] = RowwiseParallel()
    plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    return plan


def hand_pipeline_stage(
    model: torch.nn.Module,
    split_point: str,
    example: torch.Tensor,
    stage_index: int,
    group: Any = None,
) -> Any:
    """Trace ``model`` with torch's ``pipeline`` on one micro-batch, cut it before ``split_point``
    and build this process's ``PipelineStage`` (on CPU). Raises what torch's tracer raises."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    pipe = pipeline(model, mb_args=(example,), split_spec={split_point: SplitPoint.BEGINNING})
    return pipe.build_stage(stage_index, torch.device("cpu"), group=group)


def pipeline_params_held(stage: Any) -> list[torch.nn.Parameter]:
    """Every parameter a traced ``PipelineStage`` keeps alive, not only its own stage's.

    A stage built by ``pipe.build_stage`` keeps ``pipe_info.graph``, whose owning module is the
    whole split model: the other stages' parameters stay allocated in this process too.
    """
    graph = getattr(getattr(stage, "pipe_info", None), "graph", None)
    whole = getattr(graph, "owning_module", None)
    own = list(stage.submod.parameters())
    return own + list(whole.parameters()) if isinstance(whole, torch.nn.Module) else own


def fresh_accelerator(**kwargs: Any) -> Any:
    """An ``Accelerator(cpu=True, **kwargs)`` after clearing the process-wide state of the previous one."""
    from accelerando import Accelerator
    from accelerando.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(cpu=True, **kwargs)


def _local_bytes(t: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def bytes_held(params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this process holds in ``params`` (local shards of DTensors), their gradients and the
    optimizer's state tensors, each counted once; ``trained`` = the parameters with optimizer state."""
    seen: set[int] = set()
    out = {"params": 0, "trained": 0, "grads": 0, "optimizer": 0}
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        out["params"] += _local_bytes(p)
        out["trained"] += _local_bytes(p) if optimizer.state.get(p) else 0
        out["grads"] += _local_bytes(p.grad) if p.grad is not None else 0
    for state in optimizer.state.values():
        out["optimizer"] += sum(
            _local_bytes(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0
        )
    return out


def step_peak_bytes(step: Callable[[], Any]) -> int:
    """Peak of the tensor bytes allocated during one call of ``step`` and still live at that moment.

    Read from torch's profiler (``profile_memory=True``): its running "Total Allocated" counts the
    CPU allocator's allocations and frees made while profiling, starting from 0, so tensors that
    existed before the call (parameters, optimizer state) are not in it, and frees of such tensors
    during the call are not subtracted (so the figure is an upper bound). Every rank must call this
    together when ``step`` runs collectives.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    totals = [e["args"].get("Total Allocated", 0) for e in events if e.get("name") == "[memory]"]
    return int(max(totals, default=0))


def timed(step: Callable[[], Any]) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of one ``step()``: wall on the slowest rank (barriers before and after),
    and this process's CPU time (all its threads), which waiting for a busy core does not inflate."""
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    step()
    cpu = time.process_time() - cpu
    dist.barrier()
    return time.perf_counter() - start, cpu


def median_ms(times: list[float]) -> float:
    """Median of ``times`` (seconds) in milliseconds."""
    return statistics.median(times) * 1e3
