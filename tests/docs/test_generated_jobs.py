"""The job files shown in the README and the clusters guide are what ``--emit`` prints today."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHOWN_FOLDER = "/home/me/project"  # the pages show the job as written from this folder
COMMANDS = {
    "slurm": "accelerando launch --emit slurm --num_machines 2 --num_processes 16 --mixed_precision bf16 "
    "train.py --lr 0.1",
    "kubernetes": "accelerando launch --emit kubernetes --emit_image ghcr.io/example/train:latest "
    "--num_machines 2 --num_processes 16 --mixed_precision bf16 train.py",
}


def _emitted(kind: str, tmp_path: pathlib.Path) -> str:
    argv = shlex.split(COMMANDS[kind])[1:]
    env = {**os.environ, "ACCELERANDO_CONFIG_FILE": os.devnull}
    env = {k: v for k, v in env.items() if not k.startswith(("ACCELERATE_", "SLURM_"))}
    out = subprocess.run(
        [sys.executable, "-m", "accelerando.commands.cli", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.replace(str(tmp_path), SHOWN_FOLDER)


@pytest.mark.parametrize("page", ["README.md", "docs/guides/clusters.md"])
@pytest.mark.parametrize("kind", ["slurm", "kubernetes"])
def test_shown_job_file_is_what_the_command_prints(page: str, kind: str, tmp_path: pathlib.Path) -> None:
    blocks = re.findall(r"```\w+\n(.*?)```", (ROOT / page).read_text(), re.S)
    emitted = _emitted(kind, tmp_path)
    assert emitted in blocks, (
        f"{page} does not show what `{COMMANDS[kind]}` prints now; paste it in:\n{emitted}"
    )
