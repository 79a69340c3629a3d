"""Issue 27, hole 2 and messages of item 7: special files never hang a reader, links are never written through.

- A ``checkpoint_N`` folder without a manifest holding a FIFO, or a link to ``/dev/zero``, as
  ``random_states_0.pkl``: ``latest_checkpoint()`` and automatic resume return within seconds (the old
  reference-layout check opened the file first and blocked forever).
- A lock file that is a symbolic link to another file: the save refuses with one clear line and that
  file's bytes are unchanged; a lock file that is a folder, a FIFO, or cannot be opened for writing:
  one clear line, no traceback of ``os.open``.
- ``--config_file`` naming ``/dev/zero``, a FIFO or a folder says what it is.
- A safetensors header length of 2**62 is "header too large" with the file named.

Every check that could hang runs in a thread with a bound of a few seconds (a FIFO is released by
opening its writing end if the bound passes, so a failure never hangs the suite).
"""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import latest_checkpoint
from accelerando.checkpointing import lock as L
from accelerando.checkpointing.manifest import CheckpointError
from accelerando.core.settings.configfile import ConfigError, find_config_file, read_config_file
from accelerando.plugins.project import ProjectConfiguration
from suite_support import reset_accelerator_state

BOUND_S = 10.0  # far above what a regular-file check takes; a hang never ends


def bounded(call: Callable[[], Any], fifo: str | None = None, bound: float = BOUND_S) -> Any:
    """``call()`` in a thread; fail (instead of hanging) if it has not returned within ``bound`` s."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    if thread.is_alive():
        if fifo is not None:  # release the blocked reader so the thread can end
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        pytest.fail(f"hung for more than {bound} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _fresh(project: str, **kwargs: Any) -> Accelerator:
    reset_accelerator_state()
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    return Accelerator(cpu=True, project_config=config, **kwargs)


def _objects() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


@pytest.fixture
def project(tmp_path) -> str:
    """A project with one good checkpoint, ``checkpoint_0``."""
    root = str(tmp_path / "project")
    accelerator = _fresh(root)
    accelerator.prepare(*_objects())
    accelerator.save_state()
    yield root
    reset_accelerator_state()


def _plant(project: str, kind: str) -> str:
    folder = os.path.join(project, "checkpoints", "checkpoint_5")
    os.makedirs(folder)
    path = os.path.join(folder, "random_states_0.pkl")
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)
    return path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fifo", "dev_zero_link"])
def test_latest_checkpoint_and_auto_resume_do_not_hang_on_special_files(project, kind, monkeypatch) -> None:
    path = _plant(project, kind)
    fifo = path if kind == "fifo" else None
    # Within the bound; the folder is the newest by number and reported damaged by name when loaded.
    bounded(lambda: latest_checkpoint(project), fifo)
    monkeypatch.setenv("ACCELERANDO_AUTO_RESUME", "1")
    accelerator = _fresh(project)
    model, optimizer = _objects()
    with pytest.warns(UserWarning):  # the damaged checkpoint_5 is skipped with a warning naming it
        bounded(lambda: accelerator.prepare(model, optimizer), fifo)
    assert accelerator.resume_point is not None
    assert accelerator.resume_point.checkpoint.endswith("checkpoint_0")


@pytest.mark.timeout(120)
def test_load_state_of_the_special_folder_is_refused_by_name(project) -> None:
    _plant(project, "fifo")
    accelerator = _fresh(project)
    accelerator.prepare(*_objects())
    folder = os.path.join(project, "checkpoints", "checkpoint_5")
    with pytest.raises(CheckpointError, match="random_states_0.pkl"):
        bounded(lambda: accelerator.load_state(folder), os.path.join(folder, "random_states_0.pkl"))


# ------------------------------------------------------------------------------------- lock files
def _victim(tmp_path) -> tuple[str, bytes]:
    victim = str(tmp_path / "victim.txt")
    content = b"precious data that must never be overwritten\n"
    with open(victim, "wb") as handle:
        handle.write(content)
    return victim, content


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


@pytest.mark.timeout(120)
def test_save_lock_link_is_refused_and_its_target_unchanged(tmp_path) -> None:
    victim, content = _victim(tmp_path)
    out = str(tmp_path / "out")
    os.symlink(victim, str(tmp_path / ".out.lock"))
    reset_accelerator_state()
    accelerator = Accelerator(cpu=True)  # an explicit folder: the per-save lock
    accelerator.prepare(*_objects())
    with pytest.raises(CheckpointError) as info:
        accelerator.save_state(out)
    message = str(info.value)
    assert "\n" not in message and ".out.lock" in message and "symbolic link" in message, message
    assert _read(victim) == content
    assert os.path.islink(str(tmp_path / ".out.lock"))


@pytest.mark.timeout(120)
def test_project_lock_file_link_never_changes_its_target(tmp_path, monkeypatch) -> None:
    victim, content = _victim(tmp_path)
    project = str(tmp_path / "project")
    os.makedirs(project)
    os.symlink(victim, os.path.join(project, L.PROJECT_LOCK_NAME))
    accelerator = _fresh(project)
    accelerator.prepare(*_objects())
    accelerator.save_state()  # the folder itself is locked: the file is not used
    assert _read(victim) == content
    accelerator._checkpoints.target.release_locks()
    # Where folders cannot be locked, the file is: a link there is refused.
    monkeypatch.setattr(L, "_acquire_folder", lambda *args: None)
    accelerator = _fresh(project)
    accelerator.prepare(*_objects())
    with pytest.raises(CheckpointError, match=r"\.checkpoints\.lock.*symbolic link"):
        accelerator.save_state()
    assert _read(victim) == content


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_lock_file_that_is_not_a_file_gives_one_line(tmp_path, kind) -> None:
    path = str(tmp_path / ".out.lock")
    os.mkdir(path) if kind == "directory" else os.mkfifo(path)
    with pytest.raises(CheckpointError) as info:
        bounded(lambda: L._acquire(path, 0.0, str(tmp_path / "out"), "run"), path if kind == "fifo" else None)
    message = str(info.value)
    assert "\n" not in message and ".out.lock" in message, message
    assert ("a directory" if kind == "directory" else "FIFO") in message, message


@pytest.mark.timeout(60)
def test_lock_file_that_cannot_be_opened_gives_one_line(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / ".out.lock")
    open(path, "wb").close()
    immutable = subprocess.run(["chattr", "+i", path], capture_output=True).returncode == 0
    if not immutable:  # no chattr or no CAP_LINUX_IMMUTABLE here: what os.open raises for one
        real_open = os.open

        def refuse(name: Any, flags: int, *args: Any) -> int:
            if os.fspath(name) == path:
                raise PermissionError(errno.EPERM, "Operation not permitted", path)
            return real_open(name, flags, *args)

        monkeypatch.setattr(os, "open", refuse)
    try:
        with pytest.raises(CheckpointError) as info:
            L._acquire(path, 0.0, str(tmp_path / "out"), "run")
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", path], check=False)
    message = str(info.value)
    assert "\n" not in message and ".out.lock" in message and "Operation not permitted" in message, message
    assert "immutable" in message


# ------------------------------------------------------------------------------------ config files
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kind, words",
    [
        ("dev_zero", "is a character device, not a regular file"),
        ("directory", "is a directory"),
        ("fifo", "is a FIFO (named pipe), not a regular file"),
        ("missing", "does not exist"),
    ],
)
def test_config_file_says_what_it_is(tmp_path, kind, words) -> None:
    path = {"dev_zero": "/dev/zero", "directory": str(tmp_path), "missing": str(tmp_path / "nope.yaml")}.get(
        kind, str(tmp_path / "fifo.yaml")
    )
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(ConfigError) as info:
        find_config_file(path)
    message = str(info.value)
    assert words in message and path in message and "\n" not in message, message
    if kind != "missing":
        with pytest.raises(ConfigError, match="not a regular file|is a directory"):
            bounded(lambda: read_config_file(path), path if kind == "fifo" else None)


@pytest.mark.timeout(120)
def test_launch_config_file_dev_zero_is_one_line() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerando",
            "launch",
            "--config_file",
            "/dev/zero",
            "--dry-run",
            "train.py",
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'/dev/zero' is a character device, not a regular file" in lines[0], (
        result.stderr
    )


# ------------------------------------------------------------------------------ safetensors header
def test_safetensors_header_too_large_names_the_file(tmp_path) -> None:
    from accelerando.checkpointing.files import load_model_weights

    path = str(tmp_path / "model.safetensors")
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", 2**62) + b"{}" + b"\0" * 64)
    with pytest.raises(CheckpointError) as info:
        load_model_weights(path)
    message = str(info.value)
    assert path in message and "header too large" in message, message


@pytest.mark.timeout(60)
def test_other_readers_refuse_special_files_without_hanging(tmp_path) -> None:
    from accelerando.big_modeling.offload import read_safetensors_header
    from accelerando.checkpointing.digest import file_digest
    from accelerando.plugins.deepspeed import load_config
    from accelerando.utils.deepspeed import HfDeepSpeedConfig

    fifo = str(tmp_path / "ds_config.json")
    os.mkfifo(fifo)
    for path, words in ((fifo, "FIFO"), ("/dev/zero", "character device")):
        with pytest.raises(ValueError, match=words):
            bounded(lambda p=path: load_config(p), fifo)
        with pytest.raises(ValueError, match=words):
            bounded(lambda p=path: HfDeepSpeedConfig(p), fifo)
        with pytest.raises(ValueError, match=words):
            bounded(lambda p=path: read_safetensors_header(p), fifo)
        with pytest.raises(OSError, match=words):
            bounded(lambda p=path: file_digest(p), fifo)
