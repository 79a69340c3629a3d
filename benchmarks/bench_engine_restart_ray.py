"""Time from a worker kill to training again under Ray, against the restart path, in the same run.

The script and the fault are :mod:`bench_restart`'s: two CPU processes (gloo) train a small MLP with a
checkpoint every 4 steps; after step 10 rank 1 kills itself (SIGKILL); the restarted processes resume
from the step-8 checkpoint (``auto_resume``). Each process stamps its phases with wall-clock time;
they are printed relative to the kill. Three ways to run it, interleaved, on one local Ray cluster
(2 CPUs) started here:

- ``restart path``: ``accelerando launch --num_processes 2 --max_restarts 1 --auto_resume`` (no Ray);
- ``--ray``: the same launch with ``--ray ADDRESS`` (each process a Ray actor; the driver restarts them);
- ``Ray Train``: the script unchanged as a ``TorchTrainer``'s ``train_func``, restarted by Ray Train's
  ``FailureConfig(max_failures=1)`` (``ACCELERANDO_AUTO_RESUME=true`` in the workers).

Usage: ``python benchmarks/bench_engine_restart_ray.py [--repeats N] [--only restart,ray,train]``
(Linux; needs the ray extra; a few minutes per repeat on a busy machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_restart import PHASES, TRAIN

# The script as a Ray Train train_func: the try number bench_restart's script reads comes from the kill's stamp.
TRAIN_FUNC = """\
def train_func(config):
    import os, runpy, sys
    out = config["out"]
    os.environ["TORCHELASTIC_RESTART_COUNT"] = "1" if os.path.exists(os.path.join(out, "killed.0.1")) else "0"
    os.environ["ACCELERANDO_AUTO_RESUME"] = "true"
    sys.argv = [config["script"], config["project"], out]
    runpy.run_path(config["script"], run_name="__main__")
"""


def _phases(out: Path) -> dict[str, float]:
    killed = float((out / "killed.0.1").read_text())
    return {name: float((out / file).read_text()) - killed for name, file in PHASES if (out / file).exists()}


def launch_run(folder: Path, ray_address: str | None) -> dict[str, float]:
    """Run the killed launch once (with ``--ray`` when an address is given); each phase's seconds after the kill."""
    script, out = folder / "train.py", folder / "out"
    script.write_text(TRAIN)
    out.mkdir()
    exe = shutil.which("accelerando")
    cli = [exe] if exe else [sys.executable, "-m", "accelerando.commands.cli"]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "RAY_ADDRESS"))
    }
    env["OMP_NUM_THREADS"] = "1"
    ray = ["--ray", ray_address] if ray_address else []
    argv = [*cli, "launch", "--cpu", "--num_processes", "2", "--max_restarts", "1", "--auto_resume", *ray,
            str(script), str(folder / "project"), str(out)]  # fmt: skip
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"the launch failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return _phases(out)


def ray_train_run(folder: Path) -> dict[str, float]:
    """Run the killed script once under Ray Train (2 workers, max_failures=1); each phase's seconds after the kill."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    script, out = folder / "train.py", folder / "out"
    script.write_text(TRAIN)
    out.mkdir()
    namespace: dict = {"__name__": "bench_engine_restart_ray_func"}
    exec(TRAIN_FUNC, namespace)  # noqa: S102 - this file's own text
    trainer = TorchTrainer(
        namespace["train_func"],
        train_loop_config={"script": str(script), "project": str(folder / "project"), "out": str(out)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name="bench", storage_path=str(folder / "storage"), failure_config=FailureConfig(max_failures=1)
        ),
    )
    result = trainer.fit()
    if result.error is not None:
        raise RuntimeError(f"Ray Train failed: {result.error}")
    return _phases(out)


def main() -> None:
    """Start a local Ray cluster, run each way ``--repeats`` times interleaved, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", default="restart,ray,train", help="comma-separated: restart, ray, train")
    options = parser.parse_args()
    wanted = options.only.split(",")
    import ray

    os.environ["OMP_NUM_THREADS"] = "1"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    ways = {
        "restart path": lambda folder: launch_run(folder, None),
        "--ray": lambda folder: launch_run(folder, address),
        "Ray Train": ray_train_run,
    }
    keys = {"restart path": "restart", "--ray": "ray", "Ray Train": "train"}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in ways if keys[name] in wanted}
    try:
        for _ in range(options.repeats):
            for name in runs:
                with tempfile.TemporaryDirectory(prefix="bench-ray-restart-") as folder:
                    runs[name].append(ways[name](Path(folder)))
    finally:
        ray.shutdown()
    print(
        f"seconds after the kill (median of {options.repeats}; load average {os.getloadavg()[0]:.1f}), "
        + " / ".join(runs)
        + ":"
    )
    for phase, _ in PHASES:
        cells = []
        for name in runs:
            values = [run[phase] for run in runs[name] if phase in run]
            cells.append(f"{statistics.median(values):7.2f}" if values else "      -")
        print(f"  {phase:<24}{' '.join(cells)}")


if __name__ == "__main__":
    main()
