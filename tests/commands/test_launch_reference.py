"""`accelerando launch` as the reference's launch module: typed flags, --help, validation, early errors."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import patch

import pytest

from accelerando.commands import launch
from accelerando.launchers import reference as launch_utils


@pytest.fixture(autouse=True)
def clean_env(isolated_env: None) -> None:
    """No settings variable from the machine (see the root conftest)."""


def test_flags_are_typed_and_switches_default_to_false() -> None:
    parser = launch.launch_command_parser()
    args = parser.parse_args(["--num-processes", "4", "--monitor_interval", "0.5", "--multi_gpu", "t.py"])
    assert (args.num_processes, args.monitor_interval, args.multi_gpu, args.cpu) == (4, 0.5, True, False)
    args = parser.parse_args(["--num_machines", "1:4", "--zero_stage", "auto", "t.py"])
    assert (args.num_machines, args.zero_stage) == ("1:4", "auto")  # not numbers: kept for the resolver
    assert parser.parse_args(["t.py"]).fsdp_sync_module_states  # the reference's parser default


def test_help_opens_with_a_short_synopsis_in_the_listed_spellings() -> None:
    text = launch.launch_command_parser().format_help()
    first = text.splitlines()[:6]
    assert first[0] == "usage: accelerando launch [options] script.py [script args]"
    assert "--dry_run" in "\n".join(first) and "--dry-run" not in text
    assert text.index("Start a training script") < 1000  # the synopsis is short
    args = launch.launch_command_parser().parse_args(["t.py"])
    for name in vars(args):  # no flag is listed under its dash spelling (one example in the note)
        dashed = "--" + name.replace("_", "-")
        assert "_" not in name or text.count(dashed) == (1 if name == "num_processes" else 0), name
    assert launch.launch_command_parser().parse_args(["--dry-run", "t.py"]).dry_run  # both accepted


def test_validation_fills_the_namespace_from_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndebug: true\nnum_processes: 1\ndistributed_type: 'NO'\n"
        "fsdp_config:\n  fsdp_sync_module_states: false\n"
        "deepspeed_config:\n  deepspeed_config_file: no/such/file.json\n"
    )
    parser = launch.launch_command_parser()
    args = parser.parse_args(["--num_processes", "2", "--config_file", str(config), "t.py"])
    args, settings, _ = launch._validate_launch_command(args)
    assert (args.debug, args.num_processes, args.fsdp_sync_module_states) == (True, 2, False)
    assert settings.source("num_processes") == "cli:--num_processes"
    # an unknown key is a ValueError from launch_command, before anything starts
    config.write_text("compute_environment: LOCAL_MACHINE\ninvalid_key: 1\n")
    with pytest.raises(ValueError, match="invalid_key"):
        launch.launch_command(parser.parse_args(["--config_file", str(config), "t.py"]))


def test_a_missing_script_is_one_line_and_exit_2_before_any_process(tmp_path: Path) -> None:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "accelerando.commands.cli", "launch", "--cpu", "--num_processes", "2",
         str(tmp_path / "missing_script.py")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and "missing_script.py does not exist" in lines[0] and "Traceback" not in done.stderr
    )
    assert time.monotonic() - start < 60
    folder = tmp_path / "folder.py"
    folder.mkdir()
    assert launch.main([str(folder)]) == 2
    assert launch.main(["--dry_run", str(tmp_path / "missing_script.py")]) == 0  # a dry run starts nothing


def test_launch_command_leaves_the_environment_as_it_was(tmp_path: Path) -> None:
    script = tmp_path / "ok.py"
    script.write_text("import os\nassert os.environ['ACCELERANDO_MIXED_PRECISION'] == 'bf16'\n")
    before = dict(os.environ)
    launch.launch_command(
        launch.launch_command_parser().parse_args(["--mixed_precision", "bf16", str(script)])
    )
    assert dict(os.environ) == before


def test_reference_helpers_kmp_mpirun_and_no_script(tmp_path: Path) -> None:
    parser = launch.launch_command_parser()
    args, _, _ = launch._validate_launch_command(parser.parse_args(["--cpu", "t.py"]))
    _, env = launch_utils.prepare_simple_launcher_cmd_env(args)
    assert (env["KMP_AFFINITY"], env["KMP_BLOCKTIME"]) == ("granularity=fine,compact,1,0", "1")
    config = tmp_path / "mpi.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nuse_cpu: true\nnum_machines: 2\n"
        "num_processes: 4\nmain_process_ip: 127.0.0.1\nmpirun_config:\n  mpirun_hostfile: /not/here\n"
    )
    args, _, _ = launch._validate_launch_command(parser.parse_args(["--config_file", str(config), "t.py"]))
    with (
        patch.object(launch_utils, "which", return_value="/usr/bin/mpirun"),
        patch.object(launch_utils.subprocess, "check_output", return_value=b"Intel(R) MPI Library"),
    ):
        cmd, _ = launch_utils.prepare_simple_launcher_cmd_env(args)
    assert cmd[:7] == ["mpirun", "-f", "/not/here", "-ppn", "2", "-n", "4"]
    namespace = argparse.Namespace(num_processes=1, num_machines=1, main_process_port=0, cpu=True)
    launch_utils.prepare_multi_gpu_env(namespace)  # no training_script: only the agent's options
    assert namespace.master_port.isdigit() and namespace.master_port != "0"


def test_convert_nargs_to_dict_types_values_and_refuses_switches() -> None:
    convert = launch_utils._convert_nargs_to_dict
    assert convert(["--name", "bert", "--do_train", "False", "--epochs", "3", "--lr", "5e-5"]) == {
        "name": "bert", "do_train": False, "epochs": 3, "lr": 5e-5,
    }  # fmt: skip
    with pytest.raises(ValueError, match="store_true"):
        convert(["--do_train", "--epochs", "3"])
