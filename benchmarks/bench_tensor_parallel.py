"""Tensor parallelism: step time and memory per process, DDP vs TP, and Accelerator vs hand-written TP.

One run starts ``--num_processes`` processes (gloo on CPU, NCCL on GPUs) and, in each, trains the
same transformers Llama (built from a config, nothing downloaded):

1. DDP through ``Accelerator()``;
2. TP through ``Accelerator(parallelism_config=ParallelismConfig(tp_size=N))``;
3. the same TP written by hand: ``parallelize_module`` with the same plan on the same mesh, a
   plain torch loop.

2 and 3 are timed in alternating blocks of steps, so that both see the same machine load, and the
ratio of their median step times is reported (the Accelerator's overhead on tensor parallelism).
Memory: the bytes of parameters + gradients + optimizer state each process holds (exact, on any
device), and the allocator's peak on CUDA.

    python benchmarks/bench_tensor_parallel.py --num_processes 2 --steps 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch


def _llama(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 2,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=args.seq,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of this process's parameters, gradients and optimizer state (local shards only)."""
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    total = 0
    for p in model.parameters():
        total += local(p) + (local(p.grad) if p.grad is not None else 0)
    for state in optimizer.state.values():
        total += sum(local(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _accelerator_step(acc: Any, model: torch.nn.Module, opt: Any, ids: torch.Tensor) -> None:
    with acc.accumulate(model):
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()


def _hand_step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


def _hand_tp(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """The same layout written directly with torch's DTensor tensor-parallel API."""
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan: dict[str, Any] = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate())}
    for i in range(len(model.model.layers)):
        for name in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
        ):
            plan[f"model.layers.{i}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"model.layers.{i}.{name}"] = RowwiseParallel()
    plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)
    return parallelize_module(model, mesh, plan, src_data_rank=None)


def _timed(step: Any, device: torch.device, count: int) -> list[float]:
    times = []
    for _ in range(count):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def _peak(device: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch.distributed as dist

    from accelerando import Accelerator, ParallelismConfig
    from accelerando.state import AcceleratorState, GradientState

    world = dist.get_world_size() if dist.is_initialized() else int(args.num_processes)
    data = torch.randint(
        0, args.vocab, (args.steps * 2 + 8, args.batch, args.seq), generator=torch.Generator().manual_seed(1)
    )
    out: dict[str, Any] = {}

    # 1. DDP
    acc = Accelerator(cpu=args.cpu)
    device = acc.device
    model = _llama(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    batches = iter(data.to(device))
    _reset_peak(device)
    for _ in range(args.warmup):
        _accelerator_step(acc, model, opt, next(batches))
    ddp = _timed(lambda: _accelerator_step(acc, model, opt, next(batches)), device, args.steps)
    out["ddp"] = {
        "median_s": statistics.median(ddp),
        "state_bytes": _state_bytes(model, opt.optimizer),
        "peak_bytes": _peak(device),
    }
    AcceleratorState._reset_state()
    GradientState._reset_state()

    # 2 and 3: TP through the Accelerator, TP by hand, timed in alternating blocks
    acc = Accelerator(cpu=args.cpu, parallelism_config=ParallelismConfig(tp_size=world))
    tp_model = _llama(args)
    tp_opt = torch.optim.AdamW(tp_model.parameters(), lr=1e-4)
    tp_model, tp_opt = acc.prepare(tp_model, tp_opt)
    hand_model = _hand_tp(_llama(args).to(device), acc.torch_device_mesh["tp"])
    hand_opt = torch.optim.AdamW(hand_model.parameters(), lr=1e-4)
    ids = data.to(device)
    for i in range(args.warmup):
        _accelerator_step(acc, tp_model, tp_opt, ids[i])
        _hand_step(hand_model, hand_opt, ids[i])
    accel_times: list[float] = []
    hand_times: list[float] = []
    block = max(1, args.block)
    done = 0
    while done < args.steps:
        n = min(block, args.steps - done)
        batch = iter(ids[done : done + n])
        accel_times += _timed(lambda b=batch: _accelerator_step(acc, tp_model, tp_opt, next(b)), device, n)
        batch = iter(ids[done : done + n])
        hand_times += _timed(lambda b=batch: _hand_step(hand_model, hand_opt, next(b)), device, n)
        done += n
    out["tp_accelerator"] = {
        "median_s": statistics.median(accel_times),
        "state_bytes": _state_bytes(tp_model, tp_opt.optimizer),
        "applied": list(acc.runtime.strategy.applied),
    }
    out["tp_hand"] = {
        "median_s": statistics.median(hand_times),
        "state_bytes": _state_bytes(hand_model, hand_opt),
    }
    _reset_peak(device)
    for i in range(3):
        _accelerator_step(acc, tp_model, tp_opt, ids[i])
    out["tp_accelerator"]["peak_bytes"] = _peak(device)
    out["ratio_accelerator_over_hand"] = out["tp_accelerator"]["median_s"] / out["tp_hand"]["median_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table and a JSON line (rank 0's view; memory is per process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--block", type=int, default=5, help="steps per alternating timing block")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--cpu", action="store_true", help="train on CPUs (gloo) even with GPUs")
    args = parser.parse_args(argv)

    from accelerando.test_utils import run_distributed

    results = run_distributed(_worker, args.num_processes, args, timeout=3600)
    main_rank = results[0]
    print(
        f"processes={args.num_processes} hidden={args.hidden} layers={args.layers} seq={args.seq} batch={args.batch}"
    )
    print(f"{'variant':<16}{'step ms (median)':>18}{'state MiB/process':>20}{'peak MiB':>10}")
    for name in ("ddp", "tp_accelerator", "tp_hand"):
        row = main_rank[name]
        peak = row.get("peak_bytes")
        print(
            f"{name:<16}{row['median_s'] * 1e3:>18.2f}{row['state_bytes'] / 2**20:>20.2f}"
            f"{(peak / 2**20) if peak else float('nan'):>10.1f}"
        )
    ratios = [r["ratio_accelerator_over_hand"] for r in results]
    print(
        f"TP Accelerator / hand-written step time: {main_rank['ratio_accelerator_over_hand']:.3f} (per rank: "
        + ", ".join(f"{x:.3f}" for x in ratios)
        + ")"
    )
    print(json.dumps({"args": vars(args), "results": results}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
