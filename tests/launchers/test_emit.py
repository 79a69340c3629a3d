"""`accelerando launch --emit slurm|kubernetes`: job files from the launch settings.

The sbatch script runs for real on a one-machine SLURM cluster (started by
scripts/start_local_slurm.sh; skipped with the reason when slurm-wlm/munge are missing); the
PyTorchJob manifest is validated offline against the PyTorchJob schema shipped in
tests/launchers/schemas/ and each pod template against Kubernetes' own schema (kubernetes-validate).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accelerando.core.settings import Sourced, resolve
from accelerando.launchers.emit import emit_job, job_spec
from accelerando.launchers.emit.kubernetes import pytorchjob_manifest
from accelerando.launchers.emit.slurm import render_sbatch, setting_flags
from accelerando.launchers.plan import Command

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Path(__file__).parent / "schemas" / "pytorchjob-kubeflow-v1.schema.json"
SCRIPT = Command("train.py", ("--lr", "0.1"))


def _settings(**values):
    return resolve([{k: Sourced(v, f"cli:--{k}") for k, v in values.items()}])


def _launch(tmp_path: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "ACCELERANDO_CONFIG_FILE": os.devnull}
    return subprocess.run(
        [sys.executable, "-m", "accelerando.commands.launch", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- what both formats share ---------------------------------------------------------------------


def test_the_job_topology_follows_the_settings() -> None:
    spec = job_spec(_settings(num_machines=2, num_processes=16, num_cpu_threads_per_process=4), SCRIPT)
    assert (spec.num_machines, spec.nproc_per_node, spec.gpus_per_node, spec.cpus_per_node) == (2, 8, 8, 32)
    assert spec.name == "train" and not spec.elastic
    cpu = job_spec(_settings(cpu=True, num_processes=2), SCRIPT)
    assert (cpu.num_machines, cpu.nproc_per_node, cpu.gpus_per_node, cpu.cpus_per_node) == (1, 2, 0, None)
    ids = job_spec(_settings(num_machines=2, gpu_ids="0,1,2,3"), SCRIPT)
    assert ids.nproc_per_node == 4 and ids.num_processes == 8
    assert job_spec(_settings(max_restarts=2), SCRIPT).elastic
    assert job_spec(_settings(), Command("My_Train.v2.py")).name == "my-train-v2"


def test_impossible_jobs_are_refused_as_launches_are() -> None:
    with pytest.raises(ValueError, match="--multi_gpu needs the number of processes"):
        job_spec(_settings(multi_gpu=True, num_machines=2), SCRIPT)
    with pytest.raises(ValueError, match="not a multiple"):
        job_spec(_settings(num_machines=2, num_processes=3), SCRIPT)
    with pytest.raises(ValueError, match="--emit_image"):
        emit_job(_settings(emit="kubernetes"), SCRIPT)


def test_carried_settings_exclude_the_topology_and_the_emit_options() -> None:
    spec = job_spec(
        _settings(
            emit="slurm",
            emit_to="x",
            num_processes=2,
            machine_rank=0,
            mixed_precision="bf16",
            same_network=False,
        ),
        SCRIPT,
    )
    names = {f.name for f, _value in spec.carried}
    assert names == {"mixed_precision", "same_network"}
    flags, env = setting_flags(spec.carried)
    # A switch set to false has no flag: it travels as a variable.
    assert flags == ["--mixed_precision", "bf16"] and env == {"ACCELERANDO_SAME_NETWORK": "false"}


# --- SLURM ---------------------------------------------------------------------------------------


def test_the_sbatch_script_asks_for_the_job_and_takes_the_rendezvous_from_slurm(tmp_path: Path) -> None:
    settings = _settings(num_machines=4, num_processes=32, mixed_precision="bf16", use_fsdp=True)
    text = render_sbatch(job_spec(settings, SCRIPT), workdir="/shared/run")
    directives = [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=train", "--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8", "--requeue",
        "--signal=B:USR1@90", "--open-mode=append", "--chdir=/shared/run",
    ]  # fmt: skip
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in text
    assert "trap requeue_job USR1" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    for part in ('--machine_rank "$SLURM_NODEID"', '--num_machines "$SLURM_NNODES"', "$((SLURM_NNODES * 8))",
                 "--mixed_precision bf16 --use_fsdp train.py --lr 0.1"):  # fmt: skip
        assert part in srun
    script = tmp_path / "job.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_emit_to_writes_an_executable_script_from_the_config_file_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("mixed_precision: bf16\nnum_machines: 2\nmain_process_ip: 10.0.0.1\n")
    done = _launch(
        tmp_path, "--config_file", str(config), "--emit", "slurm", "--emit_to", "job.sh", "--cpu",
        "--num_processes", "4", "--gradient_accumulation_steps", "2", "train.py", "it's",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stderr and done.stdout == ""
    job = tmp_path / "job.sh"
    assert os.access(job, os.X_OK)
    text = job.read_text()
    assert "#SBATCH --nodes=2" in text and "--gpus-per-node" not in text
    assert "--mixed_precision bf16" in text and "--gradient_accumulation_steps 2" in text and "--cpu" in text
    assert "10.0.0.1" not in text  # the address comes from the allocation
    assert subprocess.run(["bash", "-n", str(job)]).returncode == 0
    printed = _launch(tmp_path, "--emit", "slurm", "--cpu", "train.py")
    assert printed.returncode == 0 and printed.stdout.startswith("#!/bin/bash")


def test_a_bad_emit_value_is_a_usage_error(tmp_path: Path) -> None:
    done = _launch(tmp_path, "--emit", "pbs", "train.py")
    assert done.returncode == 2 and "slurm" in done.stderr and "kubernetes" in done.stderr


PROBE = """
import json, os, sys
import torch
from accelerando import Accelerator
accelerator = Accelerator(cpu=True)
total = torch.tensor([accelerator.process_index + 1.0])
torch.distributed.all_reduce(total)
report = {"rank": accelerator.process_index, "world": accelerator.num_processes, "sum": total.item(),
          "node": os.environ.get("SLURM_NODEID"), "job": os.environ.get("SLURM_JOB_ID"), "args": sys.argv[1:]}
with open(os.path.join(sys.argv[1], f"rank{accelerator.process_index}.json"), "w") as handle:
    json.dump(report, handle)
"""


@pytest.fixture(scope="module")
def local_slurm() -> None:
    """A one-machine SLURM cluster; skips with the reason when it cannot be started."""
    if shutil.which("sbatch") is None:
        pytest.skip("SLURM is not installed (apt-get install -y slurm-wlm munge, as root)")
    started = subprocess.run(
        ["bash", str(ROOT / "scripts" / "start_local_slurm.sh")], capture_output=True, text=True, timeout=120
    )
    if started.returncode != 0:
        pytest.skip(f"the local SLURM cluster did not start: {started.stderr.strip()[-300:]}")


@pytest.mark.slow
def test_the_emitted_sbatch_script_runs_a_two_process_job_on_slurm(tmp_path: Path, local_slurm: None) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    emitted = _launch(tmp_path, "--emit", "slurm", "--emit_to", "job.sh", "--cpu", "--num_processes", "2",
                      "probe.py", str(out), "two words")  # fmt: skip
    assert emitted.returncode == 0, emitted.stderr
    env = {**os.environ, "ACCELERANDO_CONFIG_FILE": os.devnull}
    done = subprocess.run(
        ["sbatch", "--wait", f"--output={tmp_path / 'slurm.out'}", str(tmp_path / "job.sh")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    log = (tmp_path / "slurm.out").read_text() if (tmp_path / "slurm.out").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log
    reports = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [(r["rank"], r["world"], r["sum"], r["node"]) for r in reports] == [
        (0, 2, 3.0, "0"),
        (1, 2, 3.0, "0"),
    ]
    assert reports[0]["args"] == [str(out), "two words"] and reports[0]["job"]


# --- Kubernetes ----------------------------------------------------------------------------------


def _validate(manifest: dict) -> None:
    """The PyTorchJob schema for the job, Kubernetes' PodTemplate schema for each pod template."""
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(manifest, json.loads(SCHEMA.read_text()))
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    for kind, replica in manifest["spec"]["pytorchReplicaSpecs"].items():
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": kind.lower()},
                        "template": replica["template"]}  # fmt: skip
        kubernetes_validate.validate(pod_template, "1.30", strict=True)


def _manifest(tmp_path: Path, *argv: str) -> dict:
    done = _launch(tmp_path, "--emit", "kubernetes", *argv)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_a_fixed_size_pytorchjob_has_a_master_and_workers(tmp_path: Path) -> None:
    manifest = _manifest(
        tmp_path, "--emit_image", "registry.example/team/train:1.0", "--num_machines", "3", "--main_process_ip",
        "10.0.0.1", "--num_processes", "12", "--mixed_precision", "bf16", "--use_fsdp", "train.py", "--lr", "0.1",
    )  # fmt: skip
    _validate(manifest)
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    spec = manifest["spec"]
    assert spec["nprocPerNode"] == "4" and "elasticPolicy" not in spec
    replicas = spec["pytorchReplicaSpecs"]
    assert {kind: r["replicas"] for kind, r in replicas.items()} == {"Master": 1, "Worker": 2}
    container = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/team/train:1.0"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 4}
    args = container["command"] + container["args"]
    assert args[:2] == ["accelerando", "launch"] and args[-3:] == ["train.py", "--lr", "0.1"]
    for flag, value in (("--machine_rank", "$(RANK)"), ("--main_process_ip", "$(MASTER_ADDR)"),
                        ("--num_machines", "3"), ("--num_processes", "12")):  # fmt: skip
        assert args[args.index(flag) + 1] == value
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env == {"ACCELERANDO_MIXED_PRECISION": "bf16", "ACCELERANDO_USE_FSDP": "true"}


def test_restarts_make_an_elastic_pytorchjob(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, "--emit_image", "img:1", "--num_machines", "2", "--main_process_ip", "x",
                         "--num_processes", "2", "--cpu", "--max_restarts", "3", "-m", "pkg.train")  # fmt: skip
    _validate(manifest)
    spec = manifest["spec"]
    assert spec["elasticPolicy"] == {"rdzvBackend": "c10d", "rdzvPort": 23456, "minReplicas": 2,
                                     "maxReplicas": 2, "maxRestarts": 3}  # fmt: skip
    assert (
        list(spec["pytorchReplicaSpecs"]) == ["Worker"]
        and spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    )
    container = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--main_process_ip") + 1] == "train-worker-0"
    assert args[args.index("--rdzv_backend") + 1] == "c10d" and args[-2:] == ["-m", "pkg.train"]
    assert "resources" not in container  # a CPU job asks for no GPU


def test_the_schema_refuses_what_the_operator_refuses() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    manifest = pytorchjob_manifest(job_spec(_settings(num_machines=2, num_processes=2), SCRIPT), "img")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.validate(manifest, schema)
    for broken in ({"Chief": manifest["spec"]["pytorchReplicaSpecs"]["Master"]}, {"Master": {"replicas": 2}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**manifest, "spec": {"pytorchReplicaSpecs": broken}}, schema)
