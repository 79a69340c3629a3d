"""Multi-machine launches for real on one machine, and ranks started by Open MPI's mpirun.

Two "machines" are two `accelerando launch --num_machines 2 --machine_rank 0|1` invocations meeting on
the loopback address; each starts one process and the two form one process group. A plain
`mpirun -np 2 python script.py` (no launcher) gives each process its rank through Open MPI's
variables, which the MPI environment reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accelerando.test_utils.distributed import get_free_port

PROBE = """
import json, os, sys
import torch
from accelerando import Accelerator
accelerator = Accelerator(cpu=True)
assert accelerator.num_processes == 2, accelerator.num_processes
total = torch.tensor([accelerator.process_index + 1.0])
torch.distributed.all_reduce(total)
from accelerando.core.environments import detect_environment
cluster = detect_environment()
report = {"rank": accelerator.process_index, "world": accelerator.num_processes, "sum": total.item(),
          "local": accelerator.local_process_index, "node": cluster.node_rank, "kind": cluster.name,
          "type": str(accelerator.distributed_type)}
with open(os.path.join(sys.argv[1], f"rank{accelerator.process_index}.json"), "w") as handle:
    json.dump(report, handle)
"""


def _reports(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
def test_two_machines_on_loopback_form_one_process_group(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    port = str(get_free_port())
    env = {**os.environ, "ACCELERANDO_CONFIG_FILE": os.devnull, "OMP_NUM_THREADS": "1"}
    machines = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "accelerando.commands.launch",
                "--cpu",
                "--num_machines",
                "2",
                "--machine_rank",
                str(rank),
                "--main_process_ip",
                "127.0.0.1",
                "--main_process_port",
                port,
                "--num_processes",
                "2",
                str(tmp_path / "probe.py"),
                str(tmp_path),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    try:
        outputs = [machine.communicate(timeout=300)[0] for machine in machines]
    finally:
        for machine in machines:
            if machine.poll() is None:
                machine.kill()
    assert [machine.returncode for machine in machines] == [0, 0], outputs
    reports = _reports(tmp_path)
    assert [(r["rank"], r["world"], r["sum"], r["local"], r["node"]) for r in reports] == [
        (0, 2, 3.0, 0, 0),
        (1, 2, 3.0, 0, 1),
    ]
    assert {r["type"] for r in reports} == {"MULTI_CPU"}


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="Open MPI is not installed (apt-get install openmpi-bin)"
)
def test_ranks_started_by_plain_mpirun_are_detected(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    env = {**os.environ, "ACCELERANDO_CONFIG_FILE": os.devnull, "OMP_NUM_THREADS": "1"}
    # MPI does not say where rank 0 is: MASTER_ADDR/MASTER_PORT (exported to every rank) do.
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(get_free_port()))
    as_root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    done = subprocess.run(
        ["mpirun", *as_root, "--oversubscribe", "-np", "2", "-x", "MASTER_ADDR", "-x", "MASTER_PORT",
         "-x", "ACCELERANDO_CONFIG_FILE", "-x", "OMP_NUM_THREADS", sys.executable, str(tmp_path / "probe.py"),
         str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    reports = _reports(tmp_path)
    assert [(r["rank"], r["world"], r["sum"], r["local"], r["kind"]) for r in reports] == [
        (0, 2, 3.0, 0, "mpi"),
        (1, 2, 3.0, 1, "mpi"),
    ]
