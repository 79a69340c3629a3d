"""Device maps and memory budgets equal the reference's on random small models.

Users pin the maps ``infer_auto_device_map`` computed into configuration files, so the same model and
budgets must give the same map with accelerando as with the reference. ``device_map_parity_cases.py``
builds one random model (nesting, no-split classes, tied weights, int/bool/non-persistent buffers,
root tensors) with random budgets and options per seed; it runs once with the reference and once with
accelerando, each in its own interpreter, and every answer must match. Where the reference raises
(it fails with ``IndexError`` on some tied-weight layouts, and on a ``"disk"`` budget in
``get_balanced_memory``), accelerando answers and the case is not compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("device_map_parity_cases.py")
SEEDS = (0, 160)


def _reference_available() -> bool:
    probe = "import accelerate, sys; sys.exit(0 if 'accelerando' not in accelerate.__file__ else 1)"
    return subprocess.run([sys.executable, "-c", probe], env=_clean_env(), cwd=CASES.parent.anchor,
                          capture_output=True).returncode == 0  # fmt: skip


def _clean_env() -> dict[str, str]:
    # No stand-in on the path: ``import accelerate`` must give the reference in its interpreter.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _answers(*libraries: str) -> list[list[dict]]:
    """Each library's answers, from its own interpreter; the interpreters run at the same time."""
    import tempfile

    runs = []
    try:
        for library in libraries:
            command = [sys.executable, str(CASES), library, str(SEEDS[0]), str(SEEDS[1])]
            # files, not pipes: a pipe could fill while the other interpreter is awaited
            out, err = tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")
            runs.append((subprocess.Popen(command, env=_clean_env(), cwd=CASES.parent.anchor, stdout=out,
                                          stderr=err, text=True), out, err))  # fmt: skip
        answers = []
        for proc, out, err in runs:
            proc.wait(timeout=600)
            err.seek(0)
            assert proc.returncode == 0, f"{proc.args} exited with {proc.returncode}:\n{err.read()[-3000:]}"
            out.seek(0)
            answers.append([json.loads(line) for line in out.read().splitlines()])
        return answers
    finally:
        for proc, out, err in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            out.close()
            err.close()


@pytest.mark.skipif(not _reference_available(), reason="the reference (accelerate) is not installed")
def test_device_maps_and_budgets_match_the_reference():
    reference, ours = _answers("accelerate", "accelerando")
    assert len(reference) == len(ours) == SEEDS[1] - SEEDS[0]
    compared, differences = 0, []
    for theirs, mine in zip(reference, ours, strict=True):
        for what in ("sizes", "map", "max_layer", "maximum_sizes", "balanced", "balanced_low_zero"):
            if "raised" in theirs[what]:
                continue
            compared += 1
            if theirs[what] != mine[what]:
                differences.append(
                    f"seed {theirs['seed']} {what}: reference {theirs[what]} != ours {mine[what]}"
                )
    assert not differences, "\n".join(differences[:5])
    assert compared > 0.9 * 6 * len(reference)
