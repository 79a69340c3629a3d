"""Multi-process checkpoint behaviour: every process falls back together when one process's file is
damaged, and a checkpoint saved by 2 processes loads in 1 with a warning about the per-process parts."""

from __future__ import annotations

import json
import os
import sys

import pytest

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


_TWO_NODE_SCRIPT = """
import json, os, sys, warnings
import torch
from accelerando import Accelerator
from accelerando.checkpointing import atomic
from accelerando.utils import ProjectConfiguration

project, out = sys.argv[1], sys.argv[2]
config = ProjectConfiguration(
    project_dir=project, automatic_checkpoint_naming=True, total_limit=2, save_on_each_node=True
)
acc = Accelerator(cpu=True, project_config=config)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters()))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    folders = []
    for _ in range(3):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        folders.append(acc.save_state())
acc.wait_for_everyone()
manifest = atomic.verify_checkpoint(folders[-1], checksums=True)
acc.load_state()
root = os.path.join(project, "checkpoints")
report = {
    "nodes": acc.state.num_nodes,
    "warnings": [str(w.message) for w in caught if "save_on_each_node" in str(w.message)],
    "files": sorted(manifest.files),
    "listed": [n for n, _ in atomic.list_checkpoints(root)],
    "hidden": sorted(n for n in os.listdir(root) if n.startswith(".")),
}
with open(os.path.join(out, f"{acc.process_index}.json"), "w") as handle:
    json.dump(report, handle)
"""


@pytest.mark.slow
def test_save_on_each_node_over_a_shared_file_system_commits_once(tmp_path) -> None:
    """Two torchrun agents as two nodes of one process each, on one machine: both local mains see the
    same folder, so the checkpoint must be staged and committed once (with a warning), not raced."""
    import subprocess

    script = tmp_path / "two_nodes.py"
    script.write_text(_TWO_NODE_SCRIPT)
    project, out = tmp_path / "project", tmp_path / "out"
    out.mkdir()
    port = str(get_free_port())
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
             "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", port,
             str(script), str(project), str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]  # fmt: skip
    logs = [agent.communicate(timeout=240)[0] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], logs
    reports = [json.loads((out / f"{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["nodes"] == 2
        assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl"} <= set(
            report["files"]
        )
        assert report["listed"] == [1, 2] and report["hidden"] == []  # rotation kept 2, no staging left
    assert len(reports[0]["warnings"]) == 1 and "shared file system" in reports[0]["warnings"][0]
    assert reports[1]["warnings"] == []
