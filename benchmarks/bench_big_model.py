"""Benchmarks for big-model loading, disk offload, device-map inference and empty initialisation.

Each variant runs in a fresh Python subprocess (so imports, allocator state and peak-memory counters
start clean); variants are interleaved over ``--repeat`` rounds and the median is reported, with
ratios computed within this one run.

    python benchmarks/bench_big_model.py --workdir /tmp/bench_big_model --repeat 3

Variants:
- ``floor_single`` / ``floor_sharded``: plain PyTorch at its best: build under ``torch.device("meta")``,
  then ``load_state_dict(safetensors.torch.load_file(path), assign=True)`` (per shard), then a forward.
- ``ours_single`` / ``ours_sharded``: ``init_empty_weights`` + ``load_checkpoint_and_dispatch`` + a forward.
- ``ours_disk``: the same with ``max_memory={"cpu": "500MB"}`` (the rest offloaded to disk).
- ``device_map``: ``infer_auto_device_map`` on meta models of 2,000 and 8,000 Linear modules.
- ``empty_init``: ``init_empty_weights`` versus ``torch.device("meta")`` on a transformers Llama.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LAYERS, WIDTH = 90, 2048


def build_model():
    import torch.nn as nn

    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def prepare(workdir: str) -> None:
    """Write the 1.44 GiB checkpoint once, as one file and as 4 shards with an index."""
    import torch
    from safetensors.torch import save_file

    single = os.path.join(workdir, "single", "model.safetensors")
    if os.path.exists(single):
        return
    os.makedirs(os.path.dirname(single), exist_ok=True)
    os.makedirs(os.path.join(workdir, "sharded"), exist_ok=True)
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in build_model().state_dict().items()}
    save_file(state, single)
    names = list(state)
    weight_map = {}
    per_shard = -(-len(names) // 4)
    for shard in range(4):
        file_name = f"model-{shard + 1:05d}-of-00004.safetensors"
        part = {k: state[k] for k in names[shard * per_shard : (shard + 1) * per_shard]}
        save_file(part, os.path.join(workdir, "sharded", file_name))
        weight_map.update(dict.fromkeys(part, file_name))
    with open(os.path.join(workdir, "sharded", "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)


class AnonSampler:
    """Samples RssAnon of this process in a background thread to find its peak."""

    def __init__(self) -> None:
        import threading

        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def read(self) -> int:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        return 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.read())
            time.sleep(0.002)

    def close(self) -> int:
        self.stop.set()
        self.thread.join()
        return max(self.peak, self.read())


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_loading(variant: str, workdir: str) -> dict:
    import torch

    # Imports happen before the clock starts for every variant: the measure is load + first forward.
    from safetensors.torch import load_file

    from accelerando.big_modeling import init_empty_weights, load_checkpoint_and_dispatch

    x = torch.randn(4, WIDTH)
    sampler = AnonSampler()
    base_anon = sampler.read()
    start, start_cpu = time.perf_counter(), time.process_time()
    if variant.startswith("floor"):
        with torch.device("meta"):
            model = build_model()
        folder = os.path.join(workdir, "single" if variant == "floor_single" else "sharded")
        for name in sorted(os.listdir(folder)):
            if name.endswith(".safetensors"):
                model.load_state_dict(load_file(os.path.join(folder, name)), assign=True, strict=False)
    else:
        with init_empty_weights():
            model = build_model()
        if variant == "ours_single":
            model = load_checkpoint_and_dispatch(
                model, os.path.join(workdir, "single", "model.safetensors"), {"": "cpu"}
            )
        elif variant == "ours_sharded":
            index = os.path.join(workdir, "sharded", "model.safetensors.index.json")
            model = load_checkpoint_and_dispatch(model, index, {"": "cpu"})
        else:
            offload = os.path.join(workdir, f"offload_{os.getpid()}")
            model = load_checkpoint_and_dispatch(
                model, os.path.join(workdir, "single"), device_map="auto", max_memory={"cpu": "500MB"},
                offload_folder=offload,
            )  # fmt: skip
    with torch.no_grad():
        out = model(x)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    peak_anon = sampler.close()
    return {
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "peak_rss": _peak_rss(),
        "peak_anon": peak_anon,
        "anon_growth": peak_anon - base_anon,
        "checksum": float(out.double().sum()),
    }


def run_device_map(_: str) -> dict:
    import torch
    import torch.nn as nn

    from accelerando.utils.modeling import infer_auto_device_map

    results = {}
    for count in (2000, 8000):
        with torch.device("meta"):
            model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(count)])
        size = count * (256 * 256 + 256) * 4
        for label, budget in (("offload", {"cpu": size // 2, "disk": "1TB"}), ("fits", {"cpu": size * 2})):
            best = best_cpu = float("inf")
            for _ in range(5):
                start, start_cpu = time.perf_counter(), time.process_time()
                infer_auto_device_map(model, budget)
                best = min(best, time.perf_counter() - start)
                best_cpu = min(best_cpu, time.process_time() - start_cpu)
            results[f"{label}_{count}"] = best
            # CPU time as well: on a shared machine, wall time also counts other processes' turns.
            results[f"{label}_{count}_cpu"] = best_cpu
    return results


def run_empty_init(_: str) -> dict:
    import torch

    try:
        import transformers
    except ImportError:
        return {"skipped": "transformers not installed"}
    from accelerando.big_modeling import init_empty_weights

    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4,
    )  # fmt: skip
    for context in (torch.device("meta"), init_empty_weights()):  # warm-up: imports, first meta ops
        with context:
            transformers.LlamaForCausalLM(config)
    timings = {"torch_meta": [], "init_empty_weights": []}
    for _ in range(3):
        for label in timings:
            context = torch.device("meta") if label == "torch_meta" else init_empty_weights()
            start = time.perf_counter()
            with context:
                model = transformers.LlamaForCausalLM(config)
            timings[label].append(time.perf_counter() - start)
            assert all(p.device.type == "meta" for p in model.parameters())
    return {label: min(values) for label, values in timings.items()}


RUNNERS = {"device_map": run_device_map, "empty_init": run_empty_init}
LOADING = ("floor_single", "ours_single", "floor_sharded", "ours_sharded", "ours_disk")


def child(variant: str, workdir: str) -> None:
    runner = RUNNERS.get(variant, run_loading)
    result = runner(variant, workdir) if runner is run_loading else runner(workdir)
    print("RESULT " + json.dumps(result))


def spawn(variant: str, workdir: str) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", variant, "--workdir", workdir],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{variant} failed:\n{done.stdout}\n{done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/bench_big_model")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.workdir)
        return
    os.makedirs(args.workdir, exist_ok=True)
    prepare(args.workdir)
    rounds: dict[str, list[dict]] = {variant: [] for variant in LOADING}
    for _ in range(args.repeat):
        for variant in LOADING:
            rounds[variant].append(spawn(variant, args.workdir))
    med = {v: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for v, runs in rounds.items()}
    reference = med["floor_single"]["checksum"]
    for variant, values in med.items():
        if abs(values["checksum"] - reference) > 1e-6 * max(1.0, abs(reference)):
            raise SystemExit(f"{variant} computed a different output ({values['checksum']} vs {reference})")
    mb = 1 / 2**20
    for variant, values in med.items():
        print(f"{variant:14s} {values['seconds']:.3f} s (cpu {values['cpu_seconds']:.3f} s)  peak RSS {values['peak_rss'] * mb:.0f} MiB  "
              f"peak anon {values['peak_anon'] * mb:.0f} MiB")  # fmt: skip
    for kind in ("single", "sharded"):
        ours, floor = med[f"ours_{kind}"], med[f"floor_{kind}"]
        print(f"{kind}: time ratio {ours['seconds'] / floor['seconds']:.3f} (cpu "
              f"{ours['cpu_seconds'] / floor['cpu_seconds']:.3f}), peak RSS ratio "
              f"{ours['peak_rss'] / floor['peak_rss']:.3f}")  # fmt: skip
    layer = (WIDTH * WIDTH + WIDTH) * 4
    limit = 500 * 10**6 + 2 * layer + 250 * 2**20
    print(f"disk offload: {med['ours_disk']['seconds']:.3f} s, peak anon {med['ours_disk']['peak_anon'] * mb:.0f} MiB "
          f"(limit {limit * mb:.0f} MiB), vs in-memory floor x{med['ours_disk']['seconds'] / med['floor_single']['seconds']:.2f}")  # fmt: skip
    maps = spawn("device_map", args.workdir)
    for clock in ("", "_cpu"):
        name = "wall" if not clock else "cpu"
        print(f"infer_auto_device_map ({name} time): 8000 modules cpu+disk {maps['offload_8000' + clock]:.3f} s, "
              f"fits {maps['fits_8000' + clock]:.3f} s; 8000/2000 ratio "
              f"{maps['offload_8000' + clock] / maps['offload_2000' + clock]:.2f} (cpu+disk), "
              f"{maps['fits_8000' + clock] / maps['fits_2000' + clock]:.2f} (fits)")  # fmt: skip
    empty = spawn("empty_init", args.workdir)
    if "skipped" in empty:
        print(f"empty init: {empty['skipped']}")
    else:
        print(f"empty init (Llama ~1.1B): torch.device('meta') {empty['torch_meta']:.3f} s, init_empty_weights "
              f"{empty['init_empty_weights']:.3f} s, ratio {empty['init_empty_weights'] / empty['torch_meta']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
