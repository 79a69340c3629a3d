"""The reference's module layout of the command line: parsers, entry functions and console scripts."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelerando.commands.spellings import SPELLING_NOTE
from accelerando.commands.utils import CustomArgumentGroup, CustomArgumentParser

SURFACE = {
    "accelerate_cli": ["main"],
    "config": ["config_command_parser", "default_command_parser", "default_config_file", "get_config_parser",
               "load_config_from_file", "main", "update_command_parser"],
    "config.cluster": ["DEEPSPEED_MULTINODE_LAUNCHERS", "DYNAMO_BACKENDS", "FSDP2_STATE_DICT_TYPE",
                       "FSDP_SHARDING_STRATEGY", "TORCH_DYNAMO_MODES", "get_cluster_input"],
    "config.config": ["cache_dir", "config_command", "config_command_parser", "description", "get_user_input", "main"],
    "config.config_args": ["BaseConfig", "ClusterConfig", "SageMakerConfig", "hf_cache_home", "load_config_from_file",
                           "default_json_config_file", "default_yaml_config_file", "SAGEMAKER_PYTORCH_VERSION"],
    "config.config_utils": ["DYNAMO_BACKENDS", "SubcommandHelpFormatter"],
    "config.default": ["default_command_parser", "default_config_command", "description", "write_basic_config"],
    "config.sagemaker": ["SAGEMAKER_PARALLEL_EC2_INSTANCES", "get_sagemaker_input"],
    "config.update": ["update_command_parser", "update_config", "update_config_command"],
    "env": ["default_config_file", "env_command", "env_command_parser", "main", "version"],
    "estimate": ["add_timm_hub_prefix", "check_has_model", "create_ascii_table", "create_empty_model",
                 "estimate_command", "estimate_command_parser", "estimate_training_usage", "gather_data", "main",
                 "verify_on_hub"],
    "merge": ["main", "merge_command", "merge_command_parser"],
    "test": ["main", "test_command", "test_command_parser"],
    "to_fsdp2": ["ConversionStatus", "convert_config_to_fsdp2", "load_config", "to_fsdp2_command",
                 "to_fsdp2_command_parser"],
    "tpu": ["default_config_file", "main", "tpu_command_launcher", "tpu_command_parser"],
    "utils": ["CustomArgumentGroup", "CustomArgumentParser"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_reference_names_exist(module: str) -> None:
    mod = importlib.import_module(f"accelerando.commands.{module}")
    assert [name for name in SURFACE[module] if not hasattr(mod, name)] == []


@pytest.mark.parametrize(
    ("module", "parser_name", "argv"),
    [
        ("env", "env_command_parser", ["--config-file", "x.yaml"]),
        ("test", "test_command_parser", ["--config-file", "x.yaml"]),
        ("merge", "merge_command_parser", ["a", "b", "--max-shard-size", "1GB", "--unsafe-serialization"]),
        ("estimate", "estimate_command_parser", ["m", "--library-name", "timm", "--trust-remote-code"]),
        ("tpu", "tpu_command_parser", ["--tpu-name", "t", "--install-accelerate", "--command", "ls"]),
        ("to_fsdp2", "to_fsdp2_command_parser", ["--config-file", "a.yaml", "--output-file", "b.yaml"]),
    ],
)
def test_stand_alone_parsers_take_both_spellings(module: str, parser_name: str, argv: list[str]) -> None:
    build = getattr(importlib.import_module(f"accelerando.commands.{module}"), parser_name)
    dashed = build().parse_args(argv)
    underscored = build().parse_args(
        ["--" + a[2:].replace("-", "_") if a.startswith("--") else a for a in argv]
    )
    assert vars(dashed) == vars(underscored)
    text = build().format_help()
    assert SPELLING_NOTE in text and not any(a in text for a in argv if a.startswith("--") and "-" in a[2:])


def test_custom_argument_parser_and_group() -> None:
    parser = CustomArgumentParser(prog="p")
    parser.add_argument("--num_processes", type=int)
    group = parser.add_argument_group("G")
    assert isinstance(group, CustomArgumentGroup)
    group.add_argument("--main-process-port", type=int)
    args = parser.parse_args(["--num-processes", "2", "--main_process_port", "5"])
    assert (args.num_processes, args.main_process_port) == (2, 5)
    assert parser.parse_args(["--num", "3"]).num_processes == 3  # abbreviation still unambiguous
    text = parser.format_help()
    assert "--num_processes" in text and "--num-processes" not in text and text.count(SPELLING_NOTE) == 1


def test_config_help_lists_subcommands_without_the_choice_line() -> None:
    from accelerando.commands.config import get_config_parser

    text = get_config_parser().format_help()
    assert "default" in text and "update" in text and "{default,update}" not in text


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))
    return env


def test_top_level_help_imports_no_subcommand_module(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom accelerando.commands.accelerate_cli import main\n"
        "status = main([])\n"
        "loaded = [m for m in sys.modules if m.startswith('accelerando.commands.') and m.split('.')[2] not in "
        "('cli', 'spellings', 'accelerate_cli')]\n"
        "print('LOADED', loaded)\nsys.exit(status)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout
    for command in (
        "config",
        "env",
        "launch",
        "test",
        "estimate-memory",
        "merge-weights",
        "tpu-config",
        "to-fsdp2",
    ):
        assert command in result.stdout


def test_console_script_entry_functions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The functions behind accelerando-config / -estimate-memory / -merge-weights / -launch."""
    import torch
    from safetensors.torch import save_file

    from accelerando.commands import config, estimate, launch, merge

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    target = tmp_path / "c.yaml"
    monkeypatch.setattr(sys, "argv", ["accelerando-config", "default", "--config_file", str(target)])
    assert config.main() == 0 and target.is_file()  # argv from sys.argv, as a console script runs it

    save_file({"w": torch.zeros(4, 4)}, tmp_path / "m.safetensors")
    assert estimate.main([str(tmp_path), "--dtypes", "float32"]) == 0
    assert "Memory Usage for loading" in capsys.readouterr().out

    assert merge.main([str(tmp_path / "nothing"), str(tmp_path / "out")]) == 1
    assert "merge-weights" in capsys.readouterr().err
    assert callable(launch.main)


def test_python_dash_m_config(tmp_path: Path) -> None:
    target = tmp_path / "m.yaml"
    command = [sys.executable, "-m", "accelerando.commands.config", "default", "--config-file", str(target)]
    result = subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert target.is_file()
