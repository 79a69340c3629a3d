"""Multi-process checkpoint behaviour: every process falls back together when one process's file is
damaged, and a checkpoint saved by 2 processes loads in 1 with a warning about the per-process parts."""

from __future__ import annotations

import json
import os
import sys

from accelerando.test_utils import get_free_port

sys.path.insert(0, os.path.dirname(__file__))
import test_checkpoint_worker as worker  # noqa: E402


def _ranks(world_size: int, name: str, *args) -> None:
    ctx = worker.forkserver_context()
    port = get_free_port()
    procs = [
        ctx.Process(target=worker.rank_call, args=(r, world_size, port, name, args))
        for r in range(world_size)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
    assert [p.exitcode for p in procs] == [0] * world_size


def _reports(out_dir: str, world_size: int) -> list[dict]:
    return [json.load(open(os.path.join(out_dir, f"rank_{r}.json"))) for r in range(world_size)]


def test_damage_on_one_rank_makes_every_rank_fall_back(tmp_path) -> None:
    project = str(tmp_path / "run")
    _ranks(2, "save_two", project)
    newest = os.path.join(project, "checkpoints", "checkpoint_1")
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= set(os.listdir(newest))
    with open(os.path.join(newest, "random_states_1.pkl"), "r+b") as handle:
        handle.seek(-5, os.SEEK_END)
        handle.write(b"XXXXX")
    _ranks(2, "load_and_report", project, str(tmp_path))
    for report in _reports(str(tmp_path), 2):
        assert report["value"] == 1.0 and report["iteration"] == 1
        assert any("random_states_1.pkl" in w for w in report["warnings"])


def test_two_process_checkpoint_loads_in_one_process_with_a_warning(tmp_path) -> None:
    project = str(tmp_path / "run")
    _ranks(2, "save_two", project)
    _ranks(1, "load_and_report", project, str(tmp_path))
    (report,) = _reports(str(tmp_path), 1)
    assert report["value"] == 2.0 and report["iteration"] == 2
    assert any("saved by 2 processes and is loaded by 1" in w for w in report["warnings"])
