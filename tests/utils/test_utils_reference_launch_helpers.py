"""The reference's launch helpers (accelerando.launchers.reference): commands and environments they prepare."""

from __future__ import annotations

import argparse
import os
import sys
from unittest.mock import patch

import pytest

from accelerando.core.settings.machine import MachineInfo
from accelerando.launchers import reference as launch


@pytest.fixture(autouse=True)
def _cpu_machine(monkeypatch):
    monkeypatch.setattr(launch, "detect_machine", lambda: MachineInfo(gpu_count=0, cpu_count=4))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def _args(**values):
    base = dict(
        training_script="train.py", training_script_args=["--lr", "0.1"], module=False, no_python=False
    )
    base.update(values)
    return argparse.Namespace(**base)


def test_simple_launcher_command_and_reference_names():
    cmd, env = launch.prepare_simple_launcher_cmd_env(_args(mixed_precision="bf16", cpu=True, debug=True))
    assert cmd == [sys.executable, "train.py", "--lr", "0.1"]
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["ACCELERANDO_MIXED_PRECISION"] == "bf16"
    assert env["ACCELERATE_USE_CPU"] == "True"  # the reference spells str(True)
    assert env["ACCELERATE_DEBUG_MODE"] == "true"
    assert "MASTER_ADDR" not in env or env["MASTER_ADDR"] == os.environ.get("MASTER_ADDR")
    assert env["PATH"] == os.environ["PATH"]  # a copy of the current environment


def test_simple_launcher_module_program_and_master(monkeypatch):
    cmd, _ = launch.prepare_simple_launcher_cmd_env(_args(module=True, training_script="pkg.train"))
    assert cmd == [sys.executable, "-m", "pkg.train", "--lr", "0.1"]
    cmd, _ = launch.prepare_simple_launcher_cmd_env(_args(no_python=True, training_script="./run.sh"))
    assert cmd == ["./run.sh", "--lr", "0.1"]
    _, env = launch.prepare_simple_launcher_cmd_env(
        _args(cpu=True, num_processes=2, main_process_port=29999, num_cpu_threads_per_process=3)
    )
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["OMP_NUM_THREADS"]) == ("127.0.0.1", "29999", "3")
    _, env = launch.prepare_simple_launcher_cmd_env(
        _args(cpu=True, num_processes=4, num_machines=2, machine_rank=1, main_process_ip="10.0.0.1")
    )
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    with patch.object(launch, "which", return_value=None), pytest.raises(OSError, match="mpirun"):
        launch.prepare_simple_launcher_cmd_env(  # the reference's OSError when there is no mpirun
            _args(cpu=True, num_processes=2, mpirun_hostfile="no-such-hostfile")
        )
    with pytest.raises(ValueError, match="--module and --no_python"):
        launch.prepare_simple_launcher_cmd_env(_args(module=True, no_python=True))
    with pytest.raises(ValueError, match="training_script"):
        launch.prepare_simple_launcher_cmd_env(argparse.Namespace(mixed_precision="no"))


def test_use_cpu_alias_and_dynamo_names():
    _, env = launch.prepare_simple_launcher_cmd_env(
        _args(use_cpu=True, cpu=False, dynamo_backend="inductor", dynamo_mode="max-autotune")
    )
    assert env["ACCELERATE_USE_CPU"] == "True"  # the reference spells str(True)
    assert env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
    assert env["ACCELERATE_DYNAMO_MODE"] == "max-autotune"


def test_multi_process_env_sets_the_agent_options():
    args = _args(
        cpu=True, num_processes=2, mixed_precision="fp16", use_fsdp=True, fsdp_sharding_strategy="FULL_SHARD"
    )
    env = launch.prepare_multi_gpu_env(args)
    assert (args.nproc_per_node, args.nnodes, args.node_rank) == ("2", "1", 0)
    assert (args.master_addr, args.master_port) == ("127.0.0.1", "29500")  # text, as the reference
    assert isinstance(args.max_restarts, int) and isinstance(args.monitor_interval, float)
    assert hasattr(args, "rdzv_id") and hasattr(args, "start_method")  # torchrun's other options
    assert env["ACCELERATE_USE_FSDP"] == "true"
    assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD"
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp16"
    assert env["OMP_NUM_THREADS"] == "2"  # 4 cores shared by 2 processes


def test_multi_process_env_rejects_gpus_on_a_cpu_machine():
    with pytest.raises(ValueError, match="GPU"):
        launch.prepare_multi_gpu_env(_args(multi_gpu=True, num_processes=2))


def test_multi_gpu_env_with_gpus_and_p2p_workaround(monkeypatch):
    monkeypatch.setattr(launch, "detect_machine", lambda: MachineInfo(gpu_count=2, cpu_count=8))
    monkeypatch.setattr(launch, "check_cuda_p2p_ib_support", lambda: False)
    monkeypatch.setattr(launch, "get_current_device_type", lambda: ("cuda", "CUDA_VISIBLE_DEVICES"))
    args = _args(multi_gpu=True, num_processes=2, gpu_ids="0,1")
    env = launch.prepare_multi_gpu_env(args)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["NCCL_P2P_DISABLE"] == "1" and env["NCCL_IB_DISABLE"] == "1"


def test_deepspeed_env_and_runner(monkeypatch):
    monkeypatch.setattr(launch, "detect_machine", lambda: MachineInfo(gpu_count=2, cpu_count=8))
    args = _args(num_processes=2, zero_stage=2, offload_optimizer_device="cpu", gradient_accumulation_steps=4)
    cmd, env = launch.prepare_deepspeed_cmd_env(args)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == "cpu"
    assert env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert args.nproc_per_node == "2"
    multi = _args(
        num_processes=4, num_machines=2, main_process_ip="10.0.0.1", deepspeed_multinode_launcher="pdsh"
    )
    cmd, _ = launch.prepare_deepspeed_cmd_env(multi)
    assert "--launcher" in cmd and cmd[cmd.index("--launcher") + 1] == "pdsh"
    assert cmd[cmd.index("--num_nodes") + 1] == "2"
    with pytest.raises(ValueError, match="deepspeed_multinode_launcher"):
        launch.prepare_deepspeed_cmd_env(_args(deepspeed_multinode_launcher="rsh"))


def test_prepare_tpu():
    args = argparse.Namespace(
        mixed_precision="bf16", downcast_bf16=False, debug=True, tpu_vm=["vm1"], tpu_name="pod"
    )
    _, env = launch.prepare_tpu(args, {})
    assert env == {"XLA_USE_BF16": "1", "ACCELERATE_DEBUG_MODE": "true"}
    args.downcast_bf16 = True
    args.debug = False
    args, env = launch.prepare_tpu(args, {}, pod=True)
    assert env == {"XLA_DOWNCAST_BF16": "1"}
    assert (args.vm, args.tpu) == (["vm1"], "pod")


def test_fp8_env():
    args = argparse.Namespace(
        fp8_backend="te",
        fp8_margin=0,
        fp8_override_linear_precision=(False, False, True),
        compat_fp8_format="E4M3",
    )
    env = launch.setup_fp8_env(args, {})
    assert env["ACCELERATE_FP8_BACKEND"] == "te"
    assert env["ACCELERATE_FP8_MARGIN"] == "0"
    assert env["ACCELERATE_FP8_FORMAT"] == "E4M3"
    assert [env[f"ACCELERATE_FP8_OVERRIDE_{p}"] for p in ("FPROP", "DGRAD", "WGRAD")] == [
        "false",
        "false",
        "true",
    ]
    with pytest.raises(ValueError, match="three"):
        launch.setup_fp8_env(argparse.Namespace(fp8_override_linear_precision="true"), {})


def test_fp8_mixed_precision_exports_fp8_options():
    _, env = launch.prepare_simple_launcher_cmd_env(_args(mixed_precision="fp8", compat_fp8_backend="te"))
    assert env["ACCELERATE_FP8_BACKEND"] == "te"


def test_parallelism_config_env():
    env = launch.prepare_extend_env_parallelism_config(
        argparse.Namespace(parallelism_config_dp_shard_size=2, parallelism_config_tp_size=None), {}
    )
    assert env == {"PARALLELISM_CONFIG_DP_SHARD_SIZE": "2", "ACCELERATE_USE_PARALLELISM_CONFIG": "true"}
    assert launch.prepare_extend_env_parallelism_config(argparse.Namespace(), {}) == {}


def test_env_var_path_add(monkeypatch):
    monkeypatch.setenv("H1_PATH", os.pathsep.join(["/a", "", "/b"]))
    assert launch.env_var_path_add("H1_PATH", "/c") == os.pathsep.join(["/a", "/b", "/c"])
    assert os.environ["H1_PATH"] == os.pathsep.join(["/a", "", "/b"])
    monkeypatch.delenv("H1_PATH")
    assert launch.env_var_path_add("H1_PATH", "/c") == "/c"


def test_prepare_for_launch_sets_ranks(monkeypatch):
    for key in ("LOCAL_RANK", "RANK", "FORK_LAUNCHED"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NPROC", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    seen = {}

    def work(a, b):
        seen.update(rank=os.environ["RANK"], local=os.environ["LOCAL_RANK"], fork=os.environ["FORK_LAUNCHED"])
        return a + b

    assert launch.PrepareForLaunch(work, distributed_type="MULTI_CPU")(1, 2, 3) == 5
    assert seen == {"rank": "3", "local": "1", "fork": "1"}
    monkeypatch.delenv("RANK")
    launch.PrepareForLaunch(lambda: None, distributed_type="XLA")(0)
    assert "RANK" not in os.environ


def test_prepare_for_launch_debug_records_failures(tmp_path, monkeypatch):
    record = tmp_path / "failures.txt"
    monkeypatch.setenv("ACCELERATE_DEBUG_RDV_FILE", str(record))

    def fail():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        launch.PrepareForLaunch(fail, distributed_type="MULTI_GPU", debug=True)(0)
    assert "boom" in record.read_text()


class _SageMakerConfig:
    region = "us-east-1"
    profile = "default"
    iam_role_name = "role"
    ec2_instance_type = "ml.p3.2xlarge"
    num_machines = 1
    base_job_name = "job"
    image_uri = None
    py_version = "py38"
    pytorch_version = "1.10.2"
    transformers_version = "4.17.0"
    distributed_type = "DATA_PARALLEL"
    sagemaker_inputs_file = None
    sagemaker_metrics_file = None
    additional_args = {"max_run": 3600}


def test_sagemaker_estimator_arguments(tmp_path, monkeypatch):
    for key in ("AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    inputs = tmp_path / "inputs.tsv"
    inputs.write_text("channel\tpath\ntrain\ts3://bucket/train\n")
    config = _SageMakerConfig()
    config.sagemaker_inputs_file = str(inputs)
    args = argparse.Namespace(
        training_script="src/train.py",
        training_script_args=["--epochs", "3", "--fp16", "--name=run"],
        mixed_precision="bf16",
        dynamo_backend="no",
    )
    estimator, channels = launch.prepare_sagemager_args_inputs(config, args)
    assert os.environ["AWS_DEFAULT_REGION"] == "us-east-1" and os.environ["AWS_PROFILE"] == "default"
    assert (estimator["entry_point"], estimator["source_dir"]) == ("train.py", "src")
    assert estimator["hyperparameters"] == {"epochs": 3, "fp16": True, "name": "run"}
    assert estimator["distribution"] == {"smdistributed": {"dataparallel": {"enabled": True}}}
    assert estimator["environment"]["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert estimator["environment"]["ACCELERATE_USE_SAGEMAKER"] == "true"
    assert estimator["max_run"] == 3600
    assert channels == {"train": "s3://bucket/train"}
    config.profile = None
    with pytest.raises(OSError, match="credentials"):
        launch.prepare_sagemager_args_inputs(config, args)
    config.profile = "default"
    with pytest.raises(ValueError, match=r"\.py"):
        launch.prepare_sagemager_args_inputs(config, argparse.Namespace(training_script="run.sh"))


def test_multi_process_args_start_real_processes(tmp_path, monkeypatch):
    """The namespace prepare_multi_gpu_env fills is accepted by torch.distributed.run, which starts 2 processes."""
    import torch.distributed.run as distrib_run

    script = tmp_path / "child.py"
    script.write_text(
        "import os, pathlib\n"
        "out = pathlib.Path(os.environ['H1_OUT']) / ('rank' + os.environ['RANK'])\n"
        "out.write_text(os.environ['WORLD_SIZE'] + ' ' + os.environ['ACCELERATE_MIXED_PRECISION'])\n"
    )
    args = _args(
        training_script=str(script),
        training_script_args=[],
        cpu=True,
        num_processes=2,
        mixed_precision="bf16",
    )
    from accelerando.utils.other import get_free_port

    args.main_process_port = get_free_port()
    env = launch.prepare_multi_gpu_env(args)
    for key, value in {**env, "H1_OUT": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    distrib_run.run(args)
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0", "rank1"]
    assert (tmp_path / "rank1").read_text() == "2 bf16"


def test_simple_launcher_runs_behind_mpirun(tmp_path):
    import shutil

    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    cmd, env = launch.prepare_simple_launcher_cmd_env(
        _args(cpu=True, num_processes=2, mpirun_hostfile=str(hostfile))
    )
    assert cmd[0].endswith("mpirun") and str(hostfile) in cmd
    assert cmd[-4:] == [sys.executable, "train.py", "--lr", "0.1"]
    assert env["ACCELERATE_USE_CPU"] == "True"  # the reference spells str(True)


@pytest.mark.parametrize(
    ("helper", "values", "gpus"),
    [
        ("simple", dict(mixed_precision="bf16", cpu=True, debug=True), 0),
        ("simple", dict(cpu=True, num_processes=2, dynamo_backend="inductor", dynamo_use_fullgraph=True), 0),
        ("simple", dict(cpu=True, mixed_precision="fp8", fp8_backend="ao"), 0),
        (
            "multi",
            dict(
                cpu=True, num_processes=2, use_fsdp=True, fsdp_version=2, parallelism_config_dp_shard_size=2
            ),
            0,
        ),
        ("multi", dict(cpu=True, num_processes=2, use_fsdp=True, fsdp_sharding_strategy="FULL_SHARD"), 0),
        ("deepspeed", dict(num_processes=2, zero_stage=2, gradient_accumulation_steps=4), 2),
    ],
)
def test_helpers_write_the_plans_variables_unchanged(monkeypatch, helper, values, gpus):
    """The helpers' environment holds every variable of the launcher's plan with the plan's spelling."""
    import json

    from accelerando.core.settings.resolve import ECHOED_DEFAULTS_ENV

    monkeypatch.setattr(launch, "detect_machine", lambda: MachineInfo(gpu_count=gpus, cpu_count=8))
    args = _args(**values)
    forced = {"use_deepspeed": True} if helper == "deepspeed" else {}
    plan = launch._plan(args, launch._settings_from_args(args, **forced))
    if helper == "simple":
        _, env = launch.prepare_simple_launcher_cmd_env(args)
    elif helper == "multi":
        env = launch.prepare_multi_gpu_env(args)
    else:
        _, env = launch.prepare_deepspeed_cmd_env(args)
    assert {k: env.get(k) for k in plan.env} == dict(plan.env)
    echoed = json.loads(env.get(ECHOED_DEFAULTS_ENV, "{}"))
    assert all(env[name] == text for name, text in echoed.items())
