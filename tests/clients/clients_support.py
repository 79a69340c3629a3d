"""Helpers for the client tests: run trainer_scenario.py in fresh interpreters and check what it saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("trainer_scenario.py")

#: No downloads, one thread per process (2 CPU cores shared), DeepSpeed's CPU accelerator.
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "DS_ACCELERATOR": "cpu",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
}

Scenario = Callable[..., list[dict[str, Any]]]


def run_scenario(out: Path, *flags: str, processes: int = 1, timeout: float = 900) -> list[dict[str, Any]]:
    """Run the scenario script with ``flags``; return each rank's result (rank order).

    Raises:
        AssertionError: the run failed (its output tail is in the message) or a rank wrote nothing.
    """
    out.mkdir(parents=True, exist_ok=True)
    script = [str(SCRIPT), "--out", str(out), *flags]
    if processes == 1:
        command = [sys.executable, *script]
    else:
        command = [sys.executable, "-m", "accelerando", "launch", "--num_processes", str(processes), *script]
    env = {**os.environ, **ENV}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-6000:]).strip()
    assert proc.returncode == 0, f"scenario failed ({' '.join(flags)}):\n{tail}"
    results = []
    for rank in range(processes):
        path = out / f"result-rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result:\n{tail}"
        results.append(json.loads(path.read_text()))
    return results


def check_common(result: dict[str, Any], steps: int) -> None:
    """What every scenario must show: accelerando ran, training reached ``steps``, losses finite."""
    assert result["accelerator_module"].startswith("accelerando"), result["accelerator_module"]
    assert result["accelerate_module"] == "accelerando.stand_in"
    assert result["accelerate_version"] == "1.15.0"
    assert result["global_step"] == steps
    assert all(v == v and abs(v) < 1e4 for v in result["losses_a"].values()), result["losses_a"]
