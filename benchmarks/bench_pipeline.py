"""Benchmark: pipeline parallelism (PP=2) through the Accelerator vs the same pipeline by hand, and vs DDP.

Model: ``--layers`` Linear(width, width)+GELU blocks and a Linear head, AdamW, cross entropy, random
data. Three variants on the same model and batches, all in one ``torchrun`` job (gloo). With
``--pp_size`` below the number of processes (e.g. 4 processes, ``--pp_size 2``) the two pipeline
variants run pipeline x data parallelism: ``N / pp_size`` pipelines, each on its slice of the batch,
stage gradients averaged over the pipelines (by hand: ``all_reduce`` over the ``dp_replicate`` mesh
axis after the schedule's step):

- ``accel``: ``Accelerator(kwargs_handlers=[PipelineParallelPlugin(split_points=[middle block],
  schedule="GPipe", num_microbatches=M, loss_fn=cross_entropy)])``;
- ``hand``: the same split traced with ``torch.distributed.pipelining.pipeline`` and stepped with
  ``ScheduleGPipe`` directly (loss divided by M, as the Accelerator does);
- ``ddp``: ``Accelerator()`` (DDP over the 2 processes, each on half the batch).

``accel`` and ``hand`` steps alternate round by round so machine noise hits both; the ratio of their
median step times is printed. Peak memory is ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (a
process-lifetime peak): run with ``--only pp`` and ``--only ddp`` for clean per-variant figures.

Run: torchrun --nproc_per_node 2 benchmarks/bench_pipeline.py [--width 512] [--layers 8] [--batch 64]
     [--microbatches 4] [--steps 10] [--only {all,pp,ddp}]
     torchrun --nproc_per_node 4 benchmarks/bench_pipeline.py --pp_size 2   (pp=2 x dp=2)
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


class Stack(torch.nn.Module):
    """``layers`` Linear+GELU blocks and a 10-way head."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(layers)]
        )
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _batches(args: argparse.Namespace, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(args.batch, args.width, generator=g), torch.randint(0, 10, (args.batch,), generator=g))
        for _ in range(n)
    ]


def _fresh_accelerator(**kwargs):
    from accelerando import Accelerator
    from accelerando.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(cpu=True, **kwargs)


def _accel_pp(args: argparse.Namespace):
    from accelerando.plugins.pipeline import PipelineParallelPlugin

    plugin = PipelineParallelPlugin(
        split_points=[f"layers.{args.layers // 2}"],
        schedule="GPipe",
        num_microbatches=args.microbatches,
        loss_fn=F.cross_entropy,
        pp_size=args.pp_size,
    )
    acc = _fresh_accelerator(kwargs_handlers=[plugin])
    dp_rank, dp = acc._strategy.layout.dp_rank, acc._strategy.layout.dp_size
    torch.manual_seed(0)
    model = Stack(args.width, args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = _replica_slice(x, dp_rank, dp), _replica_slice(y, dp_rank, dp)
        out = model(x, target=y)
        acc.backward(out.loss)
        opt.step()
        opt.zero_grad()
        return out.loss.item()

    return step


def _hand_pp(args: argparse.Namespace):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline

    m, world = args.microbatches, dist.get_world_size()
    pp = args.pp_size or world
    dp = world // pp
    mesh = init_device_mesh("cpu", (dp, pp), mesh_dim_names=("dp_replicate", "pp"))
    stage_index, dp_rank = mesh["pp"].get_local_rank(), mesh["dp_replicate"].get_local_rank()
    pp_group, dp_group = mesh["pp"].get_group(), mesh["dp_replicate"].get_group()
    last = int(mesh["pp"].mesh[-1])
    torch.manual_seed(0)
    model = Stack(args.width, args.layers)
    example = torch.randn(args.batch // dp // m, args.width)
    pipe = pipeline(
        model, mb_args=(example,), split_spec={f"layers.{args.layers // 2}": SplitPoint.BEGINNING}
    )
    stage = pipe.build_stage(stage_index, torch.device("cpu"), group=pp_group)
    params = list(stage.submod.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    schedule = ScheduleGPipe(stage, m, loss_fn=lambda out, y: F.cross_entropy(out, y) / m, scale_grads=False)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = _replica_slice(x, dp_rank, dp), _replica_slice(y, dp_rank, dp)
        losses: list[torch.Tensor] = []
        if stage_index == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        loss = torch.stack(losses).sum().detach() if losses else torch.zeros(())
        dist.broadcast(loss, src=last, group=pp_group)
        if dp > 1:
            for p in params:
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=dp_group)
                    p.grad.div_(dp)
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step


def _replica_slice(t: torch.Tensor, index: int, count: int) -> torch.Tensor:
    """The ``index``-th of ``count`` equal slices of a batch (the whole batch when ``count == 1``)."""
    size = t.shape[0] // count
    return t[index * size : (index + 1) * size]


def _ddp(args: argparse.Namespace):
    acc = _fresh_accelerator()
    torch.manual_seed(0)
    model = Stack(args.width, args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    half = args.batch // acc.num_processes
    rank = acc.process_index

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        xs, ys = x[rank * half : (rank + 1) * half], y[rank * half : (rank + 1) * half]
        loss = F.cross_entropy(model(xs), ys)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step


def _timed(step, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    dist.barrier()
    start = time.perf_counter()
    step(*batch)
    dist.barrier()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--only", choices=["all", "pp", "ddp"], default="all")
    parser.add_argument(
        "--pp_size", type=int, default=None, help="pipeline stages (default: every process; fewer = pp x dp)"
    )
    args = parser.parse_args()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = _batches(args, args.warmup + args.steps)
    base = _maxrss_mb()
    report: list[str] = []
    if args.only in ("all", "pp"):
        accel, hand = _accel_pp(args), _hand_pp(args)
        times: dict[str, list[float]] = {"accel": [], "hand": []}
        for i, batch in enumerate(data):
            for name, step in (
                (("accel", accel), ("hand", hand)) if i % 2 else (("hand", hand), ("accel", accel))
            ):
                elapsed = _timed(step, batch)
                if i >= args.warmup:
                    times[name].append(elapsed)
        med = {k: statistics.median(v) for k, v in times.items()}
        report.append(
            f"PP={args.pp_size or dist.get_world_size()} x DP={dist.get_world_size() // (args.pp_size or dist.get_world_size())} "
            f"Accelerator {med['accel'] * 1e3:.1f} ms/step, by hand {med['hand'] * 1e3:.1f} ms/step, "
            f"ratio accel/hand {med['accel'] / med['hand']:.3f}"
        )
        report.append(f"PP peak RSS (maxrss, accel+hand in this process) {_maxrss_mb():.0f} MB")
    if args.only in ("all", "ddp"):
        ddp = _ddp(args)
        ddp_times = [_timed(ddp, batch) for batch in data][args.warmup :]
        report.append(f"DDP Accelerator {statistics.median(ddp_times) * 1e3:.1f} ms/step")
        report.append(f"peak RSS after DDP (process lifetime) {_maxrss_mb():.0f} MB")
    report.append(f"RSS before the models {base:.0f} MB")
    for line in report:
        print(f"[rank {rank}] {line}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
