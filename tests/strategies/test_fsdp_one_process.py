"""FSDP on one process (torchrun, accelerando launch, or plain python): it runs over a one-process group.

The launched script trains with FSDP2 (and FSDP1) and plain PyTorch side by side, then saves, reloads and
trains on, printing what it checked; one launch per FSDP version, several checks each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from accelerando.test_utils import execute_subprocess, launch_script

_SCRIPT = r"""
import copy, json, os, sys, warnings
import torch
from accelerando import Accelerator, FullyShardedDataParallelPlugin

version, folder = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
reference = copy.deepcopy(model)
batches = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(6)]

accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=version), cpu=True)
prepared = accelerator.prepare(model)
optimizer = accelerator.prepare(torch.optim.SGD(prepared.parameters(), lr=0.1))
plain_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)

def step(net, opt, x, y, backward):
    backward(torch.nn.functional.mse_loss(net(x), y))
    opt.step()
    opt.zero_grad()

for x, y in batches[:3]:
    step(prepared, optimizer, x, y, accelerator.backward)
    step(reference, plain_optimizer, x, y, lambda loss: loss.backward())
accelerator.save_state(folder)
for x, y in batches[3:]:
    step(prepared, optimizer, x, y, accelerator.backward)
    step(reference, plain_optimizer, x, y, lambda loss: loss.backward())
after_six = {k: v.clone() for k, v in accelerator.get_state_dict(prepared).items()}
accelerator.load_state(folder)
for x, y in batches[3:]:
    step(prepared, optimizer, x, y, accelerator.backward)
resumed = accelerator.get_state_dict(prepared)
plain = reference.state_dict()
report = {
    "distributed_type": str(accelerator.distributed_type),
    "num_processes": accelerator.num_processes,
    "is_fsdp2": accelerator.is_fsdp2,
    "max_diff_vs_plain": max((after_six[k] - plain[k]).abs().max().item() for k in plain),
    "max_diff_resumed": max((resumed[k] - after_six[k]).abs().max().item() for k in plain),
    "keys_match": sorted(after_six) == sorted(plain),
}
print("RESULT " + json.dumps(report), flush=True)
accelerator.end_training()
"""


def _result(stdout: str) -> dict[str, object]:
    (line,) = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


@pytest.mark.parametrize("version", [2, 1])
def test_one_launched_process_trains_with_fsdp_like_plain_pytorch_and_resumes(
    tmp_path: Path, version: int
) -> None:
    script = tmp_path / "one.py"
    script.write_text(_SCRIPT)
    done = launch_script(str(script), 1, args=[str(version), str(tmp_path / "ckpt")])
    result = _result(done.stdout)
    assert result["distributed_type"].endswith("FSDP")
    assert result["num_processes"] == 1
    assert result["is_fsdp2"] is (version == 2)
    assert result["keys_match"]
    assert result["max_diff_vs_plain"] == 0.0  # a one-process group reduces nothing: plain SGD, bit for bit
    assert result["max_diff_resumed"] == 0.0
    assert (tmp_path / "ckpt" / "checkpoint_manifest.json").is_file()
    assert "destroy_process_group" not in done.stderr  # the group is torn down at exit


def test_accelerando_launch_of_one_process_runs_fsdp(tmp_path: Path) -> None:
    script = tmp_path / "one.py"
    script.write_text(_SCRIPT)
    cmd = [sys.executable, "-m", "accelerando.commands.cli", "launch", "--cpu", "--num_processes", "1"]
    done = execute_subprocess([*cmd, str(script), "2", str(tmp_path / "ckpt")], env={"OMP_NUM_THREADS": "1"})
    assert _result(done.stdout)["max_diff_vs_plain"] == 0.0


def test_a_plain_python_process_runs_fsdp_without_opening_a_port(tmp_path: Path) -> None:
    """No launcher: the one-process group keeps its store in memory; only gloo's own socket listens, on loopback."""
    script = tmp_path / "one.py"
    script.write_text(
        _SCRIPT.replace("accelerator.end_training()", _NO_LISTENER + "accelerator.end_training()")
    )
    done = execute_subprocess(
        [sys.executable, str(script), "2", str(tmp_path / "ckpt")], env={"OMP_NUM_THREADS": "1"}
    )
    result = _result(done.stdout)
    assert result["distributed_type"].endswith("FSDP") and result["max_diff_vs_plain"] == 0.0
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("LISTENING ")]
    assert json.loads(line[len("LISTENING ") :]) in ([], ["127.0.0.1"])


_NO_LISTENER = """
import psutil
listening = [c for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
print("LISTENING", json.dumps(sorted({c.laddr.ip for c in listening})), flush=True)
"""
