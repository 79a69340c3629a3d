"""Compile time of a whole model vs regional compilation (each repeated block compiled once).

Each mode runs in a fresh process with its own empty Inductor cache folder (``TORCHINDUCTOR_CACHE_DIR``:
kernels compiled for one mode, or by an earlier run, are not reused by the other): the time of the first
forward + backward (compilation included) in wall time and in CPU time (this process and the compiler
processes it waited for; Inductor compiles in-process, ``TORCHINDUCTOR_COMPILE_THREADS=1``, so the
figure holds on a machine shared with other work, where wall time mostly measures waiting), the median of the next steps, the number of dynamo graphs,
and the largest difference from the eager model's output.

    python benchmarks/bench_regional_compile.py --blocks 8 --dim 128 --backend inductor
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import tempfile
import time

import torch


class Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        x = x + self.out(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Model(torch.nn.Module):
    def __init__(self, blocks: int, dim: int, vocab: int = 256) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(blocks))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _cpu_seconds() -> float:
    """User + system CPU time of this process and of the (finished) processes it started."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _run(mode: str, args: argparse.Namespace, queue: mp.Queue) -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    from accelerando.plugins.dynamo import TorchDynamoPlugin

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Model(args.blocks, args.dim)
    ids = torch.randint(0, 256, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = model(ids)
    plugin = TorchDynamoPlugin(backend=args.backend, use_regional_compilation=mode == "regional")
    compiled = plugin.compile(model)
    counters.clear()
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    compiled(ids).float().pow(2).mean().backward()
    first, first_cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    steps = []
    for _ in range(args.steps):
        start = time.perf_counter()
        compiled(ids).float().pow(2).mean().backward()
        steps.append(time.perf_counter() - start)
    with torch.no_grad():
        diff = (compiled(ids) - eager).abs().max().item()
    queue.put(
        {
            "mode": mode,
            "first_step_s": round(first, 2),
            "first_step_cpu_s": round(first_cpu, 2),
            "median_step_ms": round(1000 * statistics.median(steps), 1),
            "graphs": counters["stats"]["unique_graphs"],
            "max_abs_diff_vs_eager": diff,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = []
    for mode in ("whole", "regional"):
        with tempfile.TemporaryDirectory(prefix=f"inductor-{mode}-") as cache:
            # read by the spawned child when it starts
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
            os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
            queue = ctx.Queue()
            proc = ctx.Process(target=_run, args=(mode, args, queue))
            proc.start()
            results.append(queue.get())
            proc.join()
    print(json.dumps({"config": vars(args), "results": results}, indent=2))
    whole, regional = results
    for key, what in (("first_step_s", "wall"), ("first_step_cpu_s", "CPU")):
        print(
            f"compile (first step, {what}): whole {whole[key]} s, regional {regional[key]} s "
            f"({whole[key] / max(regional[key], 1e-9):.1f}x)"
        )


if __name__ == "__main__":
    main()
