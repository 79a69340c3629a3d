"""Run one client scenario on accelerando and on the reference, and compare what they computed.

Each side runs in fresh processes: the reference without the stand-in, accelerando with
``install_as_accelerate()`` (the scenario scripts do that from their ``--accelerate`` flag). Two
processes are started the same way for both sides (``torchrun`` with ``ACCELERATE_USE_CPU=true``, which
the reference needs to form one job on CPU), so the comparison is of the libraries, not the launchers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from clients_support import ENV

__all__ = ["Pair", "compare_weights", "max_relative", "run_pair", "run_side"]


@dataclass
class Pair:
    """Both sides' results (rank 0), their saved weights and wall times in seconds."""

    ours: dict[str, Any]
    reference: dict[str, Any]
    ours_weights: dict[str, torch.Tensor]
    reference_weights: dict[str, torch.Tensor]
    ours_seconds: float
    reference_seconds: float

    @property
    def time_ratio(self) -> float:
        """Wall time on accelerando / on the reference (whole processes, imports included)."""
        return self.ours_seconds / self.reference_seconds


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_side(script: Path, out: Path, side: str, flags: tuple[str, ...], processes: int) -> float:
    """Run ``script --out out --accelerate side *flags`` in ``processes`` processes; its wall time (s)."""
    out.mkdir(parents=True, exist_ok=True)
    args = [str(script), "--out", str(out), "--accelerate", side, *flags]
    if processes == 1:
        command = [sys.executable, *args]
    else:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
            "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), *args,
        ]  # fmt: skip
    env = {**os.environ, **ENV, "ACCELERATE_USE_CPU": "true"}
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    seconds = time.perf_counter() - start
    tail = (proc.stdout[-2000:] + "\n" + proc.stderr[-5000:]).strip()
    assert proc.returncode == 0, f"{side} run failed ({' '.join(flags)}):\n{tail}"
    return seconds


def run_pair(script: Path, root: Path, *flags: str, processes: int = 1) -> Pair:
    """Run ``script`` with ``flags`` on the reference, then on accelerando; return both results."""
    seconds = {}
    for side in ("reference", "accelerando"):
        seconds[side] = run_side(script, root / side, side, flags, processes)

    def loaded(side: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        result = json.loads((root / side / "result-rank0.json").read_text())
        weights = root / side / "weights-rank0.pt"
        return result, (torch.load(weights, weights_only=True) if weights.exists() else {})

    (ours, ours_w), (theirs, theirs_w) = loaded("accelerando"), loaded("reference")
    assert ours["accelerator_module"].startswith("accelerando"), ours["accelerator_module"]
    assert theirs["accelerator_module"].startswith("accelerate."), theirs["accelerator_module"]
    return Pair(ours, theirs, ours_w, theirs_w, seconds["accelerando"], seconds["reference"])


def max_relative(ours: dict[str, float], reference: dict[str, float]) -> float:
    """The largest |ours - reference| / max(|reference|, 1e-12) over the keys (which must agree)."""
    assert ours.keys() == reference.keys(), (sorted(ours), sorted(reference))
    return max((abs(ours[k] - reference[k]) / max(abs(reference[k]), 1e-12) for k in ours), default=0.0)


def compare_weights(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """Assert the same names and values equal within fp32 reassociation; return the largest difference."""
    assert ours.keys() == reference.keys(), sorted(set(ours) ^ set(reference))
    worst = 0.0
    for name, value in ours.items():
        other = reference[name]
        torch.testing.assert_close(value, other, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        worst = max(worst, float((value.float() - other.float()).abs().max()) if value.numel() else 0.0)
    return worst
