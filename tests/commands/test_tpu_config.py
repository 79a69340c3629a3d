"""`accelerando tpu-config`: the gcloud command it builds, prints (--debug) and runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from accelerando.commands.cli import main


@pytest.fixture(autouse=True)
def clean_env(isolated_env: None) -> None:
    """No settings variable from the machine (see the root conftest)."""


def _printed_command(out: str) -> list[str]:
    # The line is the reference's: words joined by spaces, the --command value unquoted.
    line = next(line for line in out.splitlines() if line.startswith("Running "))
    head, rest = line[len("Running ") :].split(" --command ", 1)
    steps, worker = rest.rsplit(" --worker ", 1)
    return [*head.split(" "), "--command", steps, "--worker", worker]


def test_debug_prints_the_gcloud_command(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tpu-config", "--tpu_name", "pod-1", "--tpu-zone", "us-central1-a", "--command", "echo", "hi",
            "--command", "ls -la", "--install_accelerate", "--accelerate_version", "0.1.0", "--debug"]  # fmt: skip
    assert main(argv) == 0
    command = _printed_command(capsys.readouterr().out)
    assert command[:9] == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "pod-1",
        "--zone",
        "us-central1-a",
        "--command",
    ]
    assert command[9] == "cd /usr/share; pip install accelerando==0.1.0; echo hi; ls -la"
    assert command[10:] == ["--worker", "all"]
    assert main(["tpu-config", "--tpu_name", "p", "--tpu_zone", "z", "--command", "x", "--use_alpha", "--debug",
                 "--install_accelerate"]) == 0  # fmt: skip
    command = _printed_command(capsys.readouterr().out)
    assert command[:2] == ["gcloud", "alpha"] and "pip install accelerando -U" in command[-3]


def test_defaults_come_from_the_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commands = tmp_path / "setup.sh"
    commands.write_text("pip install numpy\n\necho done\n")
    config = tmp_path / "tpu.yaml"
    config.write_text(
        f"distributed_type: 'NO'\ntpu_name: cfg-pod\ntpu_zone: europe-west4-a\ncommand_file: {commands}\n"
    )
    assert main(["tpu-config", "--config_file", str(config), "--debug"]) == 0
    command = _printed_command(capsys.readouterr().out)
    assert command[5] == "cfg-pod" and command[7] == "europe-west4-a"
    assert command[9] == "cd /usr/share; pip install numpy; echo done"
    assert main(["tpu-config", "--config_file", str(config), "--tpu_name", "flag-pod", "--command", "true",
                 "--debug"]) == 0  # fmt: skip
    command = _printed_command(capsys.readouterr().out)
    assert command[5] == "flag-pod" and command[9] == "cd /usr/share; true"  # flags win over the file


def test_clear_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tpu-config", "--tpu_name", "p", "--tpu_zone", "z"]) == 2
    assert "--command" in capsys.readouterr().err
    assert main(["tpu-config", "--command", "x"]) == 2
    assert "--tpu_name and --tpu_zone" in capsys.readouterr().err
    assert main(["tpu-config", "--tpu_name", "p", "--tpu_zone", "z", "--command", "x", "--install_accelerate",
                 "--accelerate_version", "dev"]) == 2  # fmt: skip
    assert "dev" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no gcloud anywhere
    assert main(["tpu-config", "--tpu_name", "p", "--tpu_zone", "z", "--command", "x"]) == 1
    err = capsys.readouterr().err
    assert "gcloud" in err and "--debug" in err


def test_runs_gcloud_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "args.txt"
    fake = bin_dir / "gcloud"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert main(["tpu-config", "--tpu_name", "p", "--tpu_zone", "z", "--command", "echo hi"]) == 0
    assert record.read_text().splitlines()[-4:] == ["--command", "cd /usr/share; echo hi", "--worker", "all"]
    assert "Successfully" in capsys.readouterr().out


def test_debug_line_is_the_references(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tpu-config", "--tpu_name", "t", "--tpu_zone", "z", "--command", "ls", "--debug"]) == 0
    out = capsys.readouterr().out
    assert "Running gcloud compute tpus tpu-vm ssh t --zone z --command cd /usr/share; ls --worker all" in out
