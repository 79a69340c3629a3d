"""Launch plans are pure: every rule is checked here without starting a process."""

from __future__ import annotations

import pytest

from accelerando.commands import launch
from accelerando.core.settings import Sourced, resolve, resolve_runtime_settings
from accelerando.core.settings.machine import MachineInfo
from accelerando.launchers.plan import Command, build, check_files, export_env

CPU_BOX = MachineInfo(gpu_count=0, cpu_count=8, python="py")
GPU_BOX = MachineInfo(gpu_count=4, cpu_count=32, python="py")


@pytest.fixture(autouse=True)
def clean_env(isolated_env: None) -> None:
    """No settings variable from the machine (see the root conftest)."""


def cli(**values):
    return resolve([{k: Sourced(v, f"cli:--{k}") for k, v in values.items()}], warn_sources=())


TRAIN = Command("train.py", ("--lr", "1"))


def plan_for(machine=CPU_BOX, command=TRAIN, **values):
    return build(cli(**values), command, machine, port=lambda: 12345)


def test_single_process_runs_the_script_directly():
    plan = plan_for()
    assert plan.mode == "simple"
    assert plan.argv == ("py", "train.py", "--lr", "1")
    assert plan.num_processes == 1
    assert plan.env["ACCELERANDO_NUM_PROCESSES"] == "1"
    assert "ACCELERANDO_MIXED_PRECISION" not in plan.env  # only values some layer set are exported
    # The reference's launcher always writes its name (transformers reads it); written with the default,
    # it is listed as an echoed default so that each process still reads it as "not set".
    assert plan.env["ACCELERATE_MIXED_PRECISION"] == "no"
    assert resolve_runtime_settings(environ=dict(plan.env)).source("mixed_precision") == "default"


def test_cpu_two_processes_uses_the_elastic_agent_with_two_processes():
    plan = plan_for(cpu=True, num_processes=2, mixed_precision="bf16")
    assert plan.mode == "elastic"
    assert plan.argv[:3] == ("py", "-m", "torch.distributed.run")
    agent = plan.agent_args
    assert agent[agent.index("--nproc_per_node") + 1] == "2"
    assert agent[agent.index("--nnodes") + 1] == "1"
    assert agent[agent.index("--master_port") + 1] == "12345"
    assert agent[-3:] == ["train.py", "--lr", "1"]
    assert plan.env["ACCELERANDO_USE_CPU"] == "true"
    assert plan.env["ACCELERANDO_MIXED_PRECISION"] == plan.env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert plan.env["OMP_NUM_THREADS"] == "4"  # 8 cores shared by 2 processes


def test_backend_flags_are_exported_before_backends_exist():
    plan = plan_for(
        use_fsdp=True, fsdp_sharding_strategy="SHARD_GRAD_OP", fsdp_transformer_layer_cls_to_wrap="A,B"
    )
    assert plan.env["ACCELERATE_USE_FSDP"] == "true"
    assert plan.env["ACCELERANDO_FSDP_SHARDING_STRATEGY"] == "SHARD_GRAD_OP"
    assert plan.env["ACCELERANDO_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP"] == "A,B"
    plan = plan_for(use_deepspeed=True, zero_stage="2", gradient_clipping="1.0")
    assert plan.env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert plan.env["ACCELERANDO_DEEPSPEED_ZERO_STAGE"] == "2"
    assert plan.env["ACCELERANDO_DEEPSPEED_GRADIENT_CLIPPING"] == "1.0"


def test_exported_env_round_trips_through_the_process_resolver():
    from accelerando.core.settings import resolve_runtime_settings

    settings = cli(
        mixed_precision="fp16", gradient_accumulation_steps="4", use_fsdp=True, fsdp_offload_params="yes"
    )
    seen = resolve_runtime_settings(environ=export_env(settings))
    for name in ("mixed_precision", "gradient_accumulation_steps", "use_fsdp", "fsdp_offload_params"):
        assert getattr(seen, name) == getattr(settings, name)
        assert seen.source(name).startswith("env:ACCELERANDO_")


def test_multi_gpu_defaults_to_one_process_per_gpu_and_gpu_ids():
    plan = plan_for(GPU_BOX, multi_gpu=True)
    assert plan.num_processes == 4 and plan.mode == "elastic"
    assert any("one per visible GPU" in n for n in plan.notes)
    plan = plan_for(GPU_BOX, multi_gpu=True, gpu_ids="0,2")
    assert plan.num_processes == 2 and plan.env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert plan_for(GPU_BOX).num_processes == 4  # several GPUs and no count: all of them
    assert plan_for(GPU_BOX, cpu=True).num_processes == 1
    assert plan_for(GPU_BOX, distributed_type="NO").num_processes == 1
    assert plan_for(MachineInfo(gpu_count=1)).mode == "simple"


def test_multi_machine_static_rendezvous():
    plan = plan_for(
        num_processes=8, num_machines=2, machine_rank=1, main_process_ip="10.0.0.1", main_process_port=6000
    )
    agent = plan.agent_args
    assert plan.nproc_per_node == 4 and plan.machine_rank == 1
    assert agent[agent.index("--node_rank") + 1] == "1"
    assert agent[agent.index("--master_addr") + 1] == "10.0.0.1"
    assert agent[agent.index("--master_port") + 1] == "6000"
    plan = plan_for(num_processes=4, num_machines=2, main_process_ip="h", rdzv_backend="c10d")
    agent = plan.agent_args
    assert agent[agent.index("--rdzv_endpoint") + 1] == "h:29500"


def test_module_and_no_python_targets():
    plan = plan_for(command=Command("pkg.train", ("x",), module=True))
    assert plan.argv == ("py", "-m", "pkg.train", "x")
    plan = plan_for(command=Command("./run.sh", (), no_python=True), num_processes=2)
    assert "--no_python" in plan.agent_args
    with pytest.raises(ValueError, match="--module and --no_python"):
        Command("x", module=True, no_python=True)


@pytest.mark.parametrize(
    ("values", "machine", "needles"),
    [
        ({"multi_gpu": True}, CPU_BOX, ["multi_gpu", "cli:--multi_gpu", "--cpu"]),
        ({"distributed_type": "MULTI_GPU"}, CPU_BOX, ["distributed_type", "no", "--cpu"]),
        ({"multi_gpu": True, "cpu": True}, GPU_BOX, ["cpu", "multi_gpu", "only one"]),
        ({"use_fsdp": True, "use_deepspeed": True}, CPU_BOX, ["use_fsdp", "use_deepspeed", "choose one"]),
        (
            {"num_processes": 3, "num_machines": 2, "main_process_ip": "h"},
            CPU_BOX,
            ["num_processes", "multiple"],
        ),
        ({"num_machines": 2, "machine_rank": 2, "main_process_ip": "h"}, CPU_BOX, ["machine_rank", "0 to 1"]),
        ({"num_machines": 2}, CPU_BOX, ["main_process_ip", "num_machines"]),
        ({"zero_stage": 4}, CPU_BOX, ["zero_stage", "0, 1, 2 or 3"]),
        ({"offload_param_device": "nvme"}, CPU_BOX, ["offload_param_device", "offload_param_nvme_path"]),
    ],
)
def test_impossible_combinations_are_rejected_with_the_fix(values, machine, needles):
    with pytest.raises(ValueError) as info:
        plan_for(machine, **values)
    for needle in needles:
        assert needle in str(info.value)
    assert "Fix" in str(info.value)


def test_a_deepspeed_config_file_is_checked_before_starting_and_only_for_deepspeed():
    plan_for(deepspeed_config_file="/nonexistent/ds.json")  # planning (e.g. on another machine) is fine
    check_files(cli(deepspeed_config_file="/nonexistent/ds.json"))  # not a DeepSpeed launch: unused
    with pytest.raises(ValueError, match="deepspeed_config_file.*existing"):
        check_files(cli(use_deepspeed=True, deepspeed_config_file="/nonexistent/ds.json"))


def test_dry_run_prints_topology_command_and_environment(capsys, tmp_path):
    code = launch.main(
        ["--dry-run", "--cpu", "--num_processes", "2", "--mixed_precision", "fp16", "t.py", "--x", "1"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "Topology: 2 process(es) on 1 machine(s)" in out
    assert "torch.distributed.run" in out and "--nproc_per_node 2" in out and "t.py --x 1" in out
    assert "ACCELERANDO_MIXED_PRECISION=fp16" in out
    assert "mixed_precision = 'fp16'  [cli:--mixed_precision]" in out


def test_script_args_pass_through_and_unknown_launcher_flags_are_refused(capsys):
    args = launch.parse(launch.build_parser(), ["--cpu", "--weird_flag", "t.py", "--cpu", "--help", "-q"])
    assert args.cpu is True and args.training_script == "t.py"
    assert args.training_script_args == ["--cpu", "--help", "-q"]
    assert args.unknown_args == ["--weird_flag"]
    assert launch.main(["--dry-run", "t.py", "--weird_flag", "a"]) == 0  # the script's own flags
    assert "t.py --weird_flag a" in capsys.readouterr().out
    # A misspelt launcher flag is an error naming it and the flag meant, not a file named "bf16".
    assert launch.main(["--dry-run", "--mixed_precison", "bf16", "t.py"]) == 2
    err = capsys.readouterr().err
    assert "--mixed_precison (did you mean --mixed_precision?)" in err and "script.py [script flags]" in err
    assert launch.main(["--dry-run", "--weird_flag", "t.py"]) == 2
    assert "unknown flag --weird_flag." in capsys.readouterr().err


def test_bad_flag_value_exits_2_with_message(capsys):
    assert launch.main(["--dry-run", "--mixed_precision", "fp12", "t.py"]) == 2
    err = capsys.readouterr().err
    assert "mixed_precision" in err and "cli:--mixed_precision" in err and "'bf16'" in err
    assert launch.main(["--dry-run", "--num_processes", "0", "t.py"]) == 2
    assert "num_processes" in capsys.readouterr().err


def test_cli_and_launch_help_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys\nfrom accelerando.commands.cli import main\n"
        "for argv in (['--help'], ['launch', '--help'], ['config', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "main(['launch', '--dry-run', '--cpu', '--num_processes', '2', 'x.py'])\n"
        "sys.exit(10 if 'torch' in sys.modules else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "estimate-memory" in result.stdout or "launch" in result.stdout


def test_elastic_agent_options_and_compat_flags_in_dry_run(capsys):
    argv = ["--dry-run", "--cpu", "--num_processes", "2", "--tee", "3", "--log_dir", "/tmp/logs", "--role", "w",
            "--fp8_backend", "te", "--ipex", "--max_restarts", "2", "--rdzv_conf", "timeout=5", "t.py"]  # fmt: skip
    assert launch.main(argv) == 0
    out = capsys.readouterr().out
    command = next(line for line in out.splitlines() if line.startswith("Command:"))
    assert "--role=w" in command and "--tee=3" in command and "--log_dir=/tmp/logs" in command
    assert "--max_restarts 2" in command and "--rdzv_conf timeout=5" in command
    assert "ACCELERATE_FP8_BACKEND=te" in out and "ACCELERATE_IPEX=true" in out


def test_public_names_resolve_lazily():
    import accelerando
    import accelerando.utils

    assert accelerando.write_basic_config is accelerando.utils.write_basic_config
    assert callable(accelerando.notebook_launcher) and callable(accelerando.debug_launcher)


def test_launcher_sources_travel_with_the_values():
    from accelerando.core.settings import resolve_runtime_settings

    config = {"mixed_precision": Sourced("bf16", "config:/c.yaml")}
    flags = {"gradient_accumulation_steps": Sourced("4", "cli:--gradient_accumulation_steps")}
    env = export_env(resolve([config, flags], warn_sources=()))
    seen = resolve_runtime_settings(environ=env)
    assert seen.source("mixed_precision") == "env:ACCELERANDO_MIXED_PRECISION"
    assert seen.origin("mixed_precision") == "config:/c.yaml"
    assert seen.origin("gradient_accumulation_steps") == "cli:--gradient_accumulation_steps"
    assert seen.origin("cpu") == "default"
    code = resolve_runtime_settings({"mixed_precision": "no"}, environ=env)
    assert code.origin("mixed_precision") == "code"  # a value from code has no launcher origin


def test_auto_choices_travel_and_are_explained_in_the_plan():
    plan = plan_for(
        cpu=True, num_processes=2, use_deepspeed=True, zero_stage="auto", offload_optimizer_device="auto"
    )
    assert plan.env["ACCELERANDO_DEEPSPEED_ZERO_STAGE"] == "auto"
    assert any(note.startswith("ZeRO stage: auto") for note in plan.notes)
    assert any(note.startswith("DeepSpeed optimizer offload: auto") for note in plan.notes)


def test_multi_machine_deepspeed_uses_deepspeeds_runner(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    plan = plan_for(
        cpu=True,
        num_processes=4,
        num_machines=2,
        main_process_ip="10.1.2.3",
        main_process_port=29511,
        use_deepspeed=True,
        zero_stage=2,
        deepspeed_hostfile=str(hostfile),
        deepspeed_inclusion_filter="worker-0@worker-1:0",
        deepspeed_multinode_launcher="openmpi",
    )
    assert plan.mode == "deepspeed"
    argv = list(plan.argv)
    assert argv[1:3] == ["-m", "deepspeed.launcher.runner"]
    for flag, value in (
        ("--num_nodes", "2"),
        ("--num_gpus", "2"),
        ("--master_addr", "10.1.2.3"),
        ("--master_port", "29511"),
        ("--launcher", "openmpi"),
        ("--hostfile", str(hostfile)),
        ("--include", "worker-0@worker-1:0"),
    ):
        assert argv[argv.index(flag) + 1] == value
    assert argv[-3:] == ["train.py", "--lr", "1"]
    assert plan.env["ACCELERANDO_DEEPSPEED_ZERO_STAGE"] == "2"
    standard = plan_for(
        cpu=True,
        num_processes=4,
        num_machines=2,
        main_process_ip="10.1.2.3",
        use_deepspeed=True,
        deepspeed_multinode_launcher="standard",
    )
    assert standard.mode == "elastic"  # "standard" means torchrun on every machine


def test_deepspeed_env_file_carries_the_settings(tmp_path):
    from accelerando.launchers.runner import write_deepspeed_env

    path = tmp_path / ".deepspeed_env"
    write_deepspeed_env({"ACCELERANDO_MIXED_PRECISION": "bf16", "A": "1"}, str(path))
    assert path.read_text().splitlines() == ["A=1", "ACCELERANDO_MIXED_PRECISION=bf16"]
    with pytest.raises(ValueError, match="newline"):
        write_deepspeed_env({"BAD": "a\nb"}, str(path))
