"""Every flag of the reference's ``launch``: accepted in both spellings, and honoured or refused by name.

Plans are built without starting anything; one real one-process launch checks ``--install_as_accelerate``
and the reference's module functions (``launch_command``, ``simple_launcher``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelerando.commands import launch
from accelerando.commands.spellings import other_spelling
from accelerando.core.settings.machine import MachineInfo
from accelerando.launchers.plan import Command, build

CPU_BOX = MachineInfo(gpu_count=0, cpu_count=4, python="py", omp_threads_set=True)

# The reference's launch flags (its interface, as `accelerate launch --help` lists them), each with a
# value to pass (None: a switch).
REFERENCE_FLAGS: dict[str, str | None] = {
    "--config_file": "c.yaml", "--quiet": None, "--module": None, "--no_python": None, "--debug": None,
    "--cpu": None, "--multi_gpu": None, "--tpu": None, "--mixed_precision": "bf16", "--num_processes": "2",
    "--num_machines": "1", "--num_cpu_threads_per_process": "1", "--enable_cpu_affinity": None,
    "--dynamo_backend": "inductor", "--dynamo_mode": "default", "--dynamo_use_fullgraph": None,
    "--dynamo_use_dynamic": None, "--dynamo_use_regional_compilation": None, "--use_deepspeed": None,
    "--use_fsdp": None, "--use_parallelism_config": None, "--use_megatron_lm": None, "--gpu_ids": "0",
    "--same_network": None, "--machine_rank": "0", "--main_process_ip": "1.2.3.4", "--main_process_port": "1",
    "--log_dir": "d", "--tee": "3", "-t": "3", "--role": "r", "--rdzv_backend": "c10d", "--rdzv_conf": "a=b",
    "--max_restarts": "1", "--monitor_interval": "1", "--tpu_cluster": None, "--no_tpu_cluster": None,
    "--tpu_use_sudo": None, "--vm": "v", "--env": "e", "--main_training_function": "main",
    "--downcast_bf16": None, "--deepspeed_config_file": "ds.json", "--zero_stage": "2",
    "--offload_optimizer_device": "cpu", "--offload_param_device": "cpu", "--offload_optimizer_nvme_path": "p",
    "--offload_param_nvme_path": "p", "--gradient_accumulation_steps": "2", "--gradient_clipping": "1.0",
    "--zero3_init_flag": "true", "--zero3_save_16bit_model": "true", "--deepspeed_hostfile": "h",
    "--deepspeed_exclusion_filter": "x", "--deepspeed_inclusion_filter": "x",
    "--deepspeed_multinode_launcher": "pdsh", "--deepspeed_moe_layer_cls_names": "A,B", "--fsdp_version": "2",
    "--fsdp_offload_params": "true", "--fsdp_min_num_params": "10", "--fsdp_sharding_strategy": "FULL_SHARD",
    "--fsdp_reshard_after_forward": "true", "--fsdp_auto_wrap_policy": "NO_WRAP",
    "--fsdp_transformer_layer_cls_to_wrap": "L", "--fsdp_backward_prefetch": "BACKWARD_PRE",
    "--fsdp_state_dict_type": "FULL_STATE_DICT", "--fsdp_forward_prefetch": "false",
    "--fsdp_use_orig_params": "true", "--fsdp_cpu_ram_efficient_loading": "true",
    "--fsdp_sync_module_states": "true", "--fsdp_activation_checkpointing": "true",
    "--fsdp_activation_checkpointing_offload": "true", "--megatron_lm_tp_degree": "2",
    "--megatron_lm_use_custom_fsdp": "true", "--megatron_lm_no_load_optim": "true",
    "--megatron_lm_eod_mask_loss": "true", "--megatron_lm_overlap_cpu_optimizer_d2h_h2d": "true",
    "--megatron_lm_no_save_optim": "true", "--megatron_lm_optimizer_cpu_offload": "true",
    "--megatron_lm_use_precision_aware_optimizer": "true", "--megatron_lm_decoder_last_pipeline_num_layers": "2",
    "--megatron_lm_pp_degree": "2", "--megatron_lm_num_micro_batches": "2",
    "--megatron_lm_sequence_parallelism": "true", "--megatron_lm_recompute_activations": "true",
    "--megatron_lm_use_distributed_optimizer": "true", "--megatron_lm_gradient_clipping": "1.0",
    "--megatron_lm_recompute_granularity": "full", "--megatron_lm_recompute_method": "uniform",
    "--megatron_lm_recompute_num_layers": "1", "--megatron_lm_attention_backend": "flash",
    "--megatron_lm_expert_model_parallel_size": "1", "--megatron_lm_context_parallel_size": "1",
    "--megatron_lm_attention_dropout": "0.1", "--megatron_lm_hidden_dropout": "0.1",
    "--megatron_lm_attention_softmax_in_fp32": "true", "--megatron_lm_expert_tensor_parallel_size": "1",
    "--megatron_lm_calculate_per_token_loss": "true", "--megatron_lm_use_rotary_position_embeddings": "true",
    "--fp8_backend": "te", "--fp8_use_autocast_during_eval": None, "--fp8_margin": "0", "--fp8_interval": "1",
    "--fp8_format": "HYBRID", "--fp8_amax_history_len": "16", "--fp8_amax_compute_algo": "max",
    "--fp8_override_linear_precision": "false,false,true", "--fp8_opt_level": "O2",
    "--fp8_enable_fsdp_float8_all_gather": "true", "--fp8_pad_inner_dim": "true", "--aws_access_key_id": "k",
    "--aws_secret_access_key": "s", "--mpirun_hostfile": "h", "--mpirun_ccl": "1",
    "--parallelism_config_dp_replicate_size": "1", "--parallelism_config_dp_shard_size": "2",
    "--parallelism_config_tp_size": "1", "--parallelism_config_cp_size": "1",
    "--parallelism_config_cp_backend": "torch", "--parallelism_config_cp_comm_strategy": "allgather",
    "--parallelism_config_sp_size": "1", "--parallelism_config_sp_backend": "deepspeed",
    "--parallelism_config_sp_seq_length": "128", "--parallelism_config_sp_seq_length_is_variable": "true",
    "--parallelism_config_sp_attn_implementation": "sdpa", "--install_as_accelerate": None,
}  # fmt: skip


def _argv(flag: str, spelling: str) -> list[str]:
    value = REFERENCE_FLAGS[flag]
    shown = (other_spelling(flag) or flag) if spelling == "dash" else flag
    return [shown] if value is None else [shown, value]


@pytest.mark.parametrize("spelling", ["underscore", "dash"])
def test_every_reference_flag_is_a_launcher_flag_in_both_spellings(spelling: str) -> None:
    parser = launch.build_parser()
    for flag in REFERENCE_FLAGS:
        args = launch.parse(parser, [*_argv(flag, spelling), "train.py", "--flag-of-the-script"])
        assert args.unknown_args == [], flag
        assert args.training_script == "train.py", flag
        assert args.training_script_args == ["--flag-of-the-script"], flag


def _resolved(argv: list[str]):
    args = launch.parse(launch.build_parser(), [*argv, "train.py"])
    return launch.resolve_launch_settings(args)[0]


def _plan(argv: list[str], **kw):
    return build(_resolved(argv), Command("train.py"), CPU_BOX, port=lambda: 23456, **kw)


@pytest.mark.parametrize(
    ("family", "argv", "expected"),
    [
        ("megatron", ["--megatron_lm_tp_degree", "2", "--megatron-lm-attention-dropout", "0.1"],
         {"MEGATRON_LM_TP_DEGREE": "2", "MEGATRON_LM_ATTENTION_DROPOUT": "0.1"}),
        ("fp8", ["--fp8_backend", "te", "--fp8-margin", "2", "--fp8_use_autocast_during_eval"],
         {"ACCELERATE_FP8_BACKEND": "te", "ACCELERATE_FP8_MARGIN": "2",
          "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL": "true"}),
        ("parallelism", ["--use_fsdp", "--parallelism-config-dp-shard-size", "1",
                         "--parallelism_config_cp_comm_strategy", "alltoall"],
         {"PARALLELISM_CONFIG_DP_SHARD_SIZE": "1", "PARALLELISM_CONFIG_CP_COMM_STRATEGY": "alltoall",
          "ACCELERATE_USE_PARALLELISM_CONFIG": "true", "ACCELERANDO_USE_PARALLELISM_CONFIG": "true"}),
        ("fsdp", ["--use_fsdp", "--fsdp-activation-checkpointing-offload", "true", "--fsdp_ignored_modules", "head"],
         {"FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "true", "FSDP_IGNORED_MODULES": "head"}),
    ],
)  # fmt: skip
def test_flag_families_flow_into_settings_and_the_reference_environment(family, argv, expected) -> None:
    env = _plan(argv).env
    for key, value in expected.items():
        assert env[key] == value, (family, key)


def test_option_families_without_their_switch_are_passed_on_with_a_note() -> None:
    notes = " ".join(_plan(["--fp8_backend", "te", "--megatron_lm_tp_degree", "2"]).notes)
    assert "fp8_backend: used only with mixed_precision fp8" in notes
    assert "megatron_lm_tp_degree: used only with --use_megatron_lm" in notes


def test_parallelism_config_needs_a_sharding_backend_and_fsdp2() -> None:
    with pytest.raises(
        ValueError, match=r"parallelism_config_tp_size \(from cli:--parallelism_config_tp_size\)"
    ):
        _plan(["--parallelism_config_tp_size", "2"])
    with pytest.raises(ValueError, match="needs FSDP2"):
        _plan(["--use_parallelism_config", "--use_fsdp", "--fsdp_version", "1"])


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--tpu_cluster"], "--tpu_cluster"),
        (["--vm", "v1", "--tpu-use-sudo"], "--tpu_use_sudo, --vm"),
        (["--aws_access_key_id", "k"], "--aws_access_key_id"),
    ],
)
def test_flags_for_places_we_cannot_launch_in_are_refused_by_name(argv, named, capsys) -> None:
    assert launch.main([*argv, "train.py"]) == 2
    err = capsys.readouterr().err
    assert named in err and "cannot be used" in err and "Fix:" in err


def test_the_reference_env_of_unsupported_places_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_SAGEMAKER", "true")
    with pytest.raises(ValueError, match="use_sagemaker .*env:ACCELERATE_USE_SAGEMAKER.*SageMaker"):
        _plan([])


def test_tee_short_flag_reaches_the_elastic_agent() -> None:
    args = launch.parse(
        launch.build_parser(), ["-t", "3", "--cpu", "--num_processes", "2", "--dry_run", "x.py"]
    )
    assert args.tee == "3"


def test_install_as_accelerate_starts_each_process_through_the_shim() -> None:
    plan = _plan(["--install_as_accelerate"])
    assert plan.argv[1:7] == ("-m", "accelerando.launchers._child", "-", "0", "script", "train.py")
    assert plan.env["ACCELERANDO_INSTALL_AS_ACCELERATE"] == "true"
    with pytest.raises(ValueError, match="--no_python"):
        launch._plan_for(
            launch.parse(launch.build_parser(), ["--install_as_accelerate", "--no_python", "ls"])
        )


def test_module_constants_and_helpers() -> None:
    assert launch.clean_option("--num-processes") == "--num_processes"
    assert launch.clean_option("-m") == "-m"
    assert "pdsh" in launch.DEEPSPEED_MULTINODE_LAUNCHERS and "INDUCTOR" in launch.DYNAMO_BACKENDS
    assert launch.TORCH_DYNAMO_MODES[0] == "default"
    assert launch.default_config_file.endswith("default_config.yaml")
    text = launch.build_parser().format_help()
    assert "--tpu_use_cluster" not in text and "--aws_access_key_id" not in text  # compatibility-only, hidden
    assert "--num_processes" in text and text.count("--num-processes") == 1  # once: the spelling note
    with pytest.raises(RuntimeError, match="TPU pods"):
        launch.tpu_pod_launcher(argparse.Namespace())
    with pytest.raises(RuntimeError, match="SageMaker"):
        launch.sagemaker_launcher(None, argparse.Namespace())


SCRIPT = """\
import sys
import accelerate.commands.spellings as theirs  # light: no torch import in the probe
import accelerando.commands.spellings as ours
assert theirs is ours, "accelerando is not installed as accelerate"
open(sys.argv[1], "w").write(theirs.__name__)
sys.exit(int(sys.argv[2]))
"""


def test_reference_module_functions_run_a_real_launch_with_install_as_accelerate(
    tmp_path: Path, monkeypatch, request
) -> None:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    monkeypatch.setenv("ACCELERANDO_CONFIG_FILE", os.devnull)
    # The launcher runs in this process and exports the launch's environment into it (it is the agent
    # process): restore it afterwards, or later tests would read this launch's settings.
    environ_before = dict(os.environ)
    request.addfinalizer(lambda: (os.environ.clear(), os.environ.update(environ_before)))
    # Another test of the same session may have imported the real package (transformers does).
    real_before = sys.modules.get("accelerate")
    parser = launch.launch_command_parser()
    out = tmp_path / "out.txt"
    args = parser.parse_args(["--install_as_accelerate", "--cpu", str(script), str(out), "0"])
    launch.launch_command(args)
    assert out.read_text() == "accelerando.commands.spellings"
    with pytest.raises(subprocess.CalledProcessError):
        launch.simple_launcher(parser.parse_args(["--install_as_accelerate", str(script), str(out), "3"]))
    with pytest.raises(ValueError, match="multi_gpu_launcher starts elastic launches"):
        launch.multi_gpu_launcher(parser.parse_args([str(script), str(out), "0"]))
    _args, settings, from_config = launch._validate_launch_command(parser.parse_args(["--cpu", str(script)]))
    assert settings.cpu is True and from_config is False
    # The launches installed the stand-in in their children, never in this process.
    assert sys.modules.get("accelerate") is real_before
