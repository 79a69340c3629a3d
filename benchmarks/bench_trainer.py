"""transformers.Trainer step time: accelerando standing in for accelerate versus the real accelerate.

The same Trainer run (tiny Llama from a config, random tokens, CPU, fp32 or bf16) is timed once with
``accelerando.install_as_accelerate()`` and once with the real ``accelerate`` package, each in a fresh
subprocess; variants are interleaved over ``--repeat`` rounds and the median is reported, with the
ratio computed within this one run. The time per optimizer step is measured inside the training loop
(a TrainerCallback, first ``--warmup`` steps excluded), so imports and process start are not counted.

    python benchmarks/bench_trainer.py --steps 60 --repeat 3            # 1 process
    python benchmarks/bench_trainer.py --processes 2 --repeat 3         # 2 processes (gloo)

Ratio = ours / reference step time; the aim is <= 0.95. Several processes are started by torchrun
for both variants (gloo), so only the training loop differs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

VARIANTS = ("accelerando", "reference")


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=10, help="first steps not timed")
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds per variant")
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--grad_accum", type=int, default=1)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(args: argparse.Namespace) -> None:
    """Train in this process with the chosen library; rank 0 writes the timed steps/s to --result."""
    if args.worker == "accelerando":
        from accelerando.core.stand_in import install_as_accelerate

        install_as_accelerate()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2 * args.seq,
    )
    rows = torch.randint(0, 128, (4096, args.seq), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": r, "labels": r} for r in rows]
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=args.grad_accum,
            max_steps=args.steps,
            save_strategy="no",
            logging_steps=10,
            report_to=[],
            use_cpu=True,
            bf16=args.bf16,
            seed=0,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(
            model=LlamaForCausalLM(config), args=training_args, train_dataset=data, callbacks=[Clock()]
        )
        trainer.train()
        used = type(trainer.accelerator).__module__
    expected = "accelerando" if args.worker == "accelerando" else "accelerate"
    if not used.startswith(expected):
        raise SystemExit(f"expected {expected}'s Accelerator, got one from {used}")
    timed = stamps[args.warmup :]
    step_s = (timed[-1] - timed[0]) / (len(timed) - 1)
    if trainer.accelerator.is_main_process and args.result:
        with open(args.result, "w") as fh:
            json.dump({"step_s": step_s, "accelerator": used, "world": trainer.accelerator.num_processes}, fh)


def _command(args: argparse.Namespace, variant: str, result: str) -> list[str]:
    script = [
        os.path.abspath(__file__),
        "--worker",
        variant,
        "--result",
        result,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--batch",
        str(args.batch),
        "--seq",
        str(args.seq),
        "--hidden",
        str(args.hidden),
        "--layers",
        str(args.layers),
        "--grad_accum",
        str(args.grad_accum),
        *(["--bf16"] if args.bf16 else []),
    ]
    if args.processes == 1:
        return [sys.executable, *script]
    # The same launcher for both (torchrun): the step time, not the launcher, is compared.
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.processes}", *script]


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the table; returns the exit status."""
    args = _parse(argv)
    if args.worker:
        worker(args)
        return 0
    if args.steps - args.warmup < 2:
        raise SystemExit("--steps must exceed --warmup by at least 2")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONWARNINGS": "ignore",
    }
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeat):
            for variant in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
                result = os.path.join(tmp, f"{variant}-{round_}.json")
                proc = subprocess.run(
                    _command(args, variant, result), env=env, capture_output=True, text=True
                )
                if proc.returncode != 0:
                    print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                    raise SystemExit(f"{variant} run failed (exit {proc.returncode})")
                with open(result) as fh:
                    report = json.load(fh)
                if report["world"] != args.processes:
                    raise SystemExit(f"{variant} ran {report['world']} process(es), not {args.processes}")
                times[variant].append(report["step_s"])
    ours, ref = (statistics.median(times[v]) for v in VARIANTS)
    label = f"{args.processes} process(es), batch {args.batch}x{args.seq}, hidden {args.hidden}"
    label += f", grad_accum {args.grad_accum}, {'bf16' if args.bf16 else 'fp32'}"
    print(f"Trainer step time, {label}; median of {args.repeat}, {args.steps - args.warmup} timed steps")
    print(f"{'variant':<12} {'ms/step':>9} {'steps/s':>9}  runs (ms/step)")
    for variant, median in (("accelerando", ours), ("reference", ref)):
        runs = ", ".join(f"{t * 1e3:.2f}" for t in times[variant])
        print(f"{variant:<12} {median * 1e3:9.2f} {1 / median:9.1f}  {runs}")
    print(f"ratio ours/reference step time: {ours / ref:.3f} (aim <= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
