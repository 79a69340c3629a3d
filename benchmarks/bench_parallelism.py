"""DDP vs TP vs PP on one model: step time and memory per process, each through the Accelerator and by hand.

One ``torchrun --nproc_per_node 2`` job (gloo; run without torchrun, the script relaunches itself
under it) trains the same Llama-style decoder (:class:`_parallel_common.LlamaStyle`, plain torch,
with a transformers-style ``tp_plan``) on the same global batches, in three modes:

- DDP: ``Accelerator()`` / ``DistributedDataParallel`` by hand; each rank takes half the batch.
- TP=2: ``Accelerator(parallelism_config=ParallelismConfig(tp_size=2))`` (the plan is the model's
  ``tp_plan``) / ``parallelize_module`` with the same plan written as torch ``ParallelStyle``s;
  both ranks take the whole batch.
- PP=2: ``Accelerator(kwargs_handlers=[PipelineParallelPlugin(split_points=["layers.L/2"], ...)])``
  / ``torch.distributed.pipelining`` ``pipeline`` + ``PipelineStage`` + the same schedule with the
  same split; the whole batch in ``--microbatches`` micro-batches.

Within a mode the Accelerator and the hand-written step alternate (their order flips every round),
so the ratio of their median step times is measured under the same machine load; "paired" is the
median over rounds of the Accelerator's step time over the hand-written one's; the CPU-time ratio
(each rank's process CPU time summed over the timed steps) is the steadiest figure on a busy
machine, where wall time mostly measures waiting for a core. Modes run one
after the other, so comparing step times across modes is fairer on a quiet machine.

Memory, per process (rank 0 / rank 1), what is measured:

- held: bytes of the parameters the process keeps alive (local shards of DTensors; for a traced
  pipeline stage, the whole split model it references), "trained" those with optimizer state, and
  the optimizer's state, after a step (exact; not RSS, which is noisy and process-lifetime);
- step peak: the peak of tensor bytes allocated during one extra training step and still live at
  that moment (torch profiler, ``profile_memory=True``: the CPU allocator's running total from the
  start of the step); activations, gradients, communication buffers. Parameters and optimizer
  state that exist before the step are not in it; "peak" = held params + optimizer + step peak.

    torchrun --nproc_per_node 2 benchmarks/bench_parallelism.py [--steps 20] [--warmup 2]
        [--hidden 256] [--layers 4] [--seq 64] [--batch 8] [--vocab 1024] [--schedule GPipe]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _parallel_common as C  # noqa: E402

Step = Callable[[torch.Tensor, torch.Tensor], Any]


def _model(args: argparse.Namespace) -> C.LlamaStyle:
    torch.manual_seed(0)
    return C.LlamaStyle(args.vocab, args.hidden, args.layers, args.heads, args.seq)


def _half(t: torch.Tensor) -> torch.Tensor:
    size = t.shape[0] // dist.get_world_size()
    rank = dist.get_rank()
    return t[rank * size : (rank + 1) * size]


def _plain_step(
    model: torch.nn.Module, opt: Any, backward: Callable[[torch.Tensor], None], part: Callable
) -> Step:
    def step(ids: torch.Tensor, target: torch.Tensor) -> float:
        loss = C.causal_lm_loss(model(part(ids)), part(target))
        backward(loss)
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step


def _ddp(args: argparse.Namespace) -> dict[str, tuple[Step, Callable[[], dict[str, int]]]]:
    acc = C.fresh_accelerator()
    model = _model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    hand = torch.nn.parallel.DistributedDataParallel(_model(args))
    hand_opt = torch.optim.AdamW(hand.parameters(), lr=1e-4)
    return {
        "accelerator": (
            _plain_step(model, opt, acc.backward, _half),
            lambda: C.bytes_held(model.parameters(), opt.optimizer),
        ),
        "hand": (
            _plain_step(hand, hand_opt, lambda loss: loss.backward(), _half),
            lambda: C.bytes_held(hand.parameters(), hand_opt),
        ),
    }


def _tp(args: argparse.Namespace) -> dict[str, tuple[Step, Callable[[], dict[str, int]]]]:
    from torch.distributed.tensor.parallel import parallelize_module

    from accelerando import ParallelismConfig

    world = dist.get_world_size()
    acc = C.fresh_accelerator(parallelism_config=ParallelismConfig(tp_size=world))
    model = _model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    hand = _model(args)
    # the same weights on every rank (the seed already gives them; the Accelerator broadcasts too)
    with torch.no_grad():
        for t in [*hand.parameters(), *hand.buffers()]:
            dist.broadcast(t.data, src=0)
    hand = parallelize_module(hand, acc.torch_device_mesh["tp"], C.hand_tp_plan(hand), src_data_rank=None)
    hand_opt = torch.optim.AdamW(hand.parameters(), lr=1e-4)
    whole = lambda t: t  # noqa: E731 - TP ranks read the same batch
    return {
        "accelerator": (
            _plain_step(model, opt, acc.backward, whole),
            lambda: C.bytes_held(model.parameters(), opt.optimizer),
        ),
        "hand": (
            _plain_step(hand, hand_opt, lambda loss: loss.backward(), whole),
            lambda: C.bytes_held(hand.parameters(), hand_opt),
        ),
    }


def _pp(args: argparse.Namespace) -> dict[str, tuple[Step, Callable[[], dict[str, int]]]]:
    import torch.distributed.pipelining as pipelining

    from accelerando.plugins.pipeline import PipelineParallelPlugin

    m = args.microbatches
    split = f"layers.{args.layers // 2}"
    plugin = PipelineParallelPlugin(
        split_points=[split], schedule=args.schedule, num_microbatches=m, loss_fn=C.causal_lm_loss
    )
    acc = C.fresh_accelerator(kwargs_handlers=[plugin])
    model = _model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)

    def accel_step(ids: torch.Tensor, target: torch.Tensor) -> float:
        out = model(ids, target=target)
        acc.backward(out.loss)
        opt.step()
        opt.zero_grad()
        return out.loss.item()

    rank, world = dist.get_rank(), dist.get_world_size()
    example = torch.zeros(args.batch // m, args.seq, dtype=torch.long)
    stage = C.hand_pipeline_stage(_model(args), split, example, rank)
    params = list(stage.submod.parameters())
    hand_opt = torch.optim.AdamW(params, lr=1e-4)
    cls = pipelining.ScheduleGPipe if args.schedule.lower() == "gpipe" else pipelining.Schedule1F1B
    schedule = cls(stage, m, loss_fn=lambda out, y: C.causal_lm_loss(out, y) / m, scale_grads=False)

    def hand_step(ids: torch.Tensor, target: torch.Tensor) -> float:
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(ids)
        else:
            schedule.step(target=target, losses=losses)
        loss = torch.stack(losses).sum().detach() if losses else torch.zeros(())
        dist.broadcast(loss, src=world - 1)
        hand_opt.step()
        hand_opt.zero_grad()
        return loss.item()

    return {
        "accelerator": (accel_step, lambda: C.bytes_held(model.parameters(), opt.optimizer)),
        # the traced stage keeps the whole split model alive (see pipeline_params_held)
        "hand": (hand_step, lambda: C.bytes_held(C.pipeline_params_held(stage), hand_opt)),
    }


def _run_mode(args: argparse.Namespace, variants: dict, data: list) -> dict[str, Any]:
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    names = list(variants)
    for i, (ids, target) in enumerate(data):
        for name in names if i % 2 else reversed(names):
            step = variants[name][0]
            elapsed = C.timed(lambda s=step, x=ids, y=target: s(x, y))
            if i >= args.warmup:
                times[name].append(elapsed)
    out: dict[str, Any] = {}
    for name, (step, held) in variants.items():
        # zero_grad(set_to_none) ran: gradients are allocated inside the step and so are in step_peak
        peak = C.step_peak_bytes(lambda s=step: s(*data[0]))
        out[name] = {
            "ms": C.median_ms([w for w, _ in times[name]]),
            "cpu_ms": C.median_ms([c for _, c in times[name]]),
            "step_peak": peak,
            "held": held(),
        }
    accel, hand = times["accelerator"], times["hand"]
    out["ratio"] = out["accelerator"]["ms"] / out["hand"]["ms"]
    # each round's Accelerator step over the hand-written step of the same round: load drifts cancel
    out["paired"] = statistics.median(a[0] / h[0] for a, h in zip(accel, hand, strict=True))
    out["cpu_ratio"] = sum(c for _, c in accel) / sum(c for _, c in hand)
    return out


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(args.warmup + args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
        data.append((ids, torch.roll(ids, -1, dims=1)))
    results: dict[str, Any] = {}
    for mode, build in (("DDP", _ddp), ("TP", _tp), ("PP", _pp)):
        if mode.lower() not in args.modes:
            continue
        variants = build(args)
        results[mode] = _run_mode(args, variants, data)
        del variants
    return results


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def _table(args: argparse.Namespace, per_rank: list[dict[str, Any]]) -> str:
    world = len(per_rank)
    rows = [
        "| mode | variant | step ms (median) | Accelerator / hand: wall (paired) | Accelerator / hand: CPU time | params MiB held (trained) | optimizer MiB | "
        "step peak MiB | peak MiB (params + optimizer + step peak) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    labels = {
        "DDP": "DDP",
        "TP": f"TP={world}",
        "PP": f"PP={world} ({args.schedule}, {args.microbatches} mb)",
    }
    for mode in ("DDP", "TP", "PP"):
        if mode not in per_rank[0]:
            continue
        for variant in ("accelerator", "hand"):
            cells = [per_rank[r][mode][variant] for r in range(world)]

            def per(f: Callable[[dict], int], cells: list = cells) -> str:
                return " / ".join(_mib(f(c)) for c in cells)

            # the barriers make every rank time the same steps: rank 0's ratios stand for all
            wall = f"{per_rank[0][mode]['ratio']:.3f} (paired {per_rank[0][mode]['paired']:.3f})"
            cpu = " / ".join(f"{per_rank[r][mode]['cpu_ratio']:.3f}" for r in range(world))
            rows.append(
                f"| {labels[mode]} | {variant} | {cells[0]['ms']:.1f} | {wall if variant == 'accelerator' else ''} | "
                f"{cpu if variant == 'accelerator' else ''} | "
                f"{per(lambda c: c['held']['params'])} ({per(lambda c: c['held']['trained'])}) | "
                f"{per(lambda c: c['held']['optimizer'])} | {per(lambda c: c['step_peak'])} | "
                f"{per(lambda c: c['held']['params'] + c['held']['optimizer'] + c['step_peak'])} |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (relaunching under torchrun when needed); rank 0 prints a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="processes when the script launches itself")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", choices=["GPipe", "1F1B"], default="GPipe")
    parser.add_argument("--modes", default="ddp,tp,pp", help="comma-separated subset of ddp,tp,pp")
    args = parser.parse_args(argv)
    args.modes = [m.strip().lower() for m in args.modes.split(",") if m.strip()]
    if "RANK" not in os.environ:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.nproc), __file__]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        return subprocess.call([*cmd, *(argv if argv is not None else sys.argv[1:])], env=env)
    dist.init_process_group("gloo")
    try:
        if args.batch % dist.get_world_size() or args.batch % args.microbatches:
            raise SystemExit(f"--batch {args.batch} must divide by the processes and by --microbatches")
        mine = _worker(args)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        if dist.get_rank() == 0:
            print(
                f"processes={dist.get_world_size()} hidden={args.hidden} layers={args.layers} heads={args.heads} "
                f"vocab={args.vocab} seq={args.seq} batch={args.batch} steps={args.steps} warmup={args.warmup} "
                f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; per-rank cells are rank 0 / rank 1"
            )
            print(_table(args, gathered), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
