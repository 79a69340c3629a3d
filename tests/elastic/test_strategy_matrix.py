"""Issue 44 (4): state saved under one strategy and process count loads under another.

Each cell saves after a few AdamW steps (tests/elastic/matrix.py), loads in a fresh process group under
another strategy and process count, and checks that the loaded weights and optimizer state equal the
saved ones exactly and that the next losses match an uninterrupted one-process run from the saved state
(max relative difference <= 1e-6); a refused cell must raise one line before anything is applied.

The default run covers DDP 2 -> one process, FSDP2 (sharded DCP) 2 -> one process, one process -> FSDP2 2
and a refusal; the whole matrix (1, 2 and 4 processes; single, DDP, FSDP2, FSDP1, ZeRO 1/2/3) is slow.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import matrix  # noqa: E402


def _save(strategy: str, world: int, folder: str) -> dict:
    saved = matrix._launch(matrix.save_rank, world, strategy, folder)[0]
    saved["reference"] = matrix.reference_losses(saved["state"])
    return saved


def _continues(saved: dict, outcome: dict) -> None:
    verdict = matrix._judge(saved, outcome)
    assert verdict["kind"] == "continues", verdict
    assert verdict["state_diff"] == 0.0, verdict
    assert verdict["max_rel"] <= matrix.TOLERANCE, verdict


def test_ddp_and_fsdp2_load_on_one_process_and_one_process_loads_under_fsdp2(tmp_path) -> None:
    ddp = _save("ddp", 2, str(tmp_path / "ddp"))
    fsdp = _save("fsdp2", 2, str(tmp_path / "fsdp2"))
    single = _save("single", 1, str(tmp_path / "single"))
    on_one = matrix._launch(matrix.load_rank, 1, "single", [str(tmp_path / "ddp"), str(tmp_path / "fsdp2")])[
        0
    ]
    _continues(ddp, on_one[0])
    _continues(fsdp, on_one[1])
    (on_fsdp,) = matrix._launch(matrix.load_rank, 2, "fsdp2", [str(tmp_path / "single")])[0]
    _continues(single, on_fsdp)


def test_a_layout_without_a_conversion_is_refused_in_one_line_before_anything_is_applied(tmp_path) -> None:
    folder = str(tmp_path / "single")
    _save("single", 1, folder)
    path = os.path.join(folder, "checkpoint_manifest.json")
    manifest = json.load(open(path))
    manifest["extra"]["layout"] = {"strategy": "megatron", "format": "megatron"}
    with open(path, "w") as handle:
        json.dump(manifest, handle)
    (outcome,) = matrix._launch(matrix.load_rank, 1, "single", [folder])[0]
    assert "refused" in outcome, outcome
    line = outcome["refused"]
    assert line.startswith("CheckpointConversionError: "), line
    assert "\n" not in line
    assert "saved under megatron on 1 process" in line and "no conversion from that layout" in line
    assert outcome["untouched"] == 0.0  # nothing was applied


@pytest.mark.slow
@pytest.mark.usefixtures("deepspeed_cpu_op")
def test_every_cell_of_the_matrix_continues_exactly(tmp_path) -> None:
    every = matrix.cells((1, 2, 4))
    results = matrix.run_matrix(every, every, str(tmp_path))
    table = matrix.markdown(results, every, every)
    bad = {
        cell: r
        for cell, r in results.items()
        if r["kind"] != "continues" or r["state_diff"] or r["max_rel"] > matrix.TOLERANCE
    }
    assert not bad, table
