"""Issue 41 item 6: names read from files, and files we write, never reach outside where they belong.

(a) A DCP ``.metadata`` naming ``sub/__0_0.distcp`` where ``sub`` is a link to a folder outside the
    checkpoint is refused (``load_sharded_model``, ``merge_fsdp_weights`` and ``accelerando
    merge-weights``), naming the link; the same name through a real folder still loads.
(b) Temporary files are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a fresh name:
    ``to-fsdp2 --output_file X`` with a link planted at ``X.tmp`` leaves the file it points to
    untouched (before: overwritten), and so do the config writers and the manifest commit.
(c) ``ACCELERANDO_CONFIG_FILE`` naming a missing file, a FIFO or a folder is one clear error (before:
    silently ignored); ``/dev/null`` is the spelling of "no config file".
(d) A TensorBoard project name with ``../`` or an absolute path cannot leave ``logging_dir``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from accelerando.checkpointing.manifest import CheckpointError
from accelerando.core.safe_files import NotRegularFileError, check_regular_inside, replace_file

# ---------------------------------------------------------------- (a) DCP shard names


def _shards(root: str) -> tuple[torch.nn.Module, str]:
    """A one-process DCP checkpoint of a small model as ``root/pytorch_model_fsdp_0``."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    folder = os.path.join(root, "pytorch_model_fsdp_0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns that no process group exists
        dcp.save({"model": model.state_dict()}, checkpoint_id=folder)
    return model, folder


def _move_shards_into(folder: str, sub: str, target: str) -> None:
    """Move every shard file to ``target`` and reach it as ``sub/<name>`` (a link, or ``target`` itself)."""
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(folder):
        if name.endswith(".distcp"):
            shutil.move(os.path.join(folder, name), os.path.join(target, name))
    if os.path.join(folder, sub) != target:
        os.symlink(target, os.path.join(folder, sub))
    metadata_path = os.path.join(folder, ".metadata")
    with open(metadata_path, "rb") as handle:
        metadata = pickle.load(handle)  # the test's own file: trusted
    for info in metadata.storage_data.values():
        info.relative_path = f"{sub}/{info.relative_path}"
    with open(metadata_path, "wb") as handle:
        pickle.dump(metadata, handle)


def _fresh_linear() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Linear(4, 3)


def test_a_shard_reached_through_a_linked_folder_is_refused(tmp_path) -> None:
    from accelerando.backends.strategies.fsdp.checkpoint import merge_fsdp_weights
    from accelerando.backends.strategies.fsdp.state import load_sharded_model

    root = str(tmp_path / "ckpt")
    _, folder = _shards(root)
    _move_shards_into(folder, "sub", str(tmp_path / "outside"))
    link = os.path.join(folder, "sub")
    model = _fresh_linear()
    before = model.weight.detach().clone()
    with pytest.raises(CheckpointError, match=rf"{link!r} is a symbolic link, not a folder"):
        load_sharded_model(model, root, 0)
    assert torch.equal(model.weight, before)
    with pytest.raises(CheckpointError, match="is a symbolic link, not a folder"):
        merge_fsdp_weights(folder, str(tmp_path / "merged"))
    done = subprocess.run(
        [sys.executable, "-m", "accelerando", "merge-weights", folder, str(tmp_path / "merged_cli")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0 and "is a symbolic link, not a folder" in done.stderr, done.stderr[-2000:]
    assert not os.path.exists(tmp_path / "merged_cli" / "model.safetensors")


def test_a_shard_in_a_real_subfolder_still_loads(tmp_path) -> None:
    from accelerando.backends.strategies.fsdp.state import load_sharded_model

    root = str(tmp_path / "ckpt")
    saved, folder = _shards(root)
    _move_shards_into(folder, "sub", os.path.join(folder, "sub"))
    model = _fresh_linear()
    assert load_sharded_model(model, root, 0)
    assert torch.equal(model.weight, saved.weight)


def test_every_component_is_looked_at(tmp_path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_bytes(b"x")
    os.symlink(tmp_path / "a", tmp_path / "link")
    check_regular_inside(str(tmp_path), "a/b/f")
    with pytest.raises(NotRegularFileError, match=r"link' is a symbolic link, not a folder"):
        check_regular_inside(str(tmp_path), "link/b/f")
    with pytest.raises(NotRegularFileError, match=r"f' is a regular file, not a folder"):
        check_regular_inside(str(tmp_path), "a/b/f/g")
    with pytest.raises(FileNotFoundError):
        check_regular_inside(str(tmp_path), "a/missing/f")


# ---------------------------------------------------------------- (b) temporary files


@pytest.fixture
def victim(tmp_path) -> str:
    """A file outside the folders written to; links planted in them point at it."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return str(path)


def test_to_fsdp2_never_writes_through_a_planted_temporary_link(tmp_path, victim) -> None:
    from accelerando.commands.to_fsdp2 import to_fsdp2_command

    source = tmp_path / "fsdp1.yaml"
    source.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n")
    output = tmp_path / "out" / "fsdp2.yaml"
    output.parent.mkdir()
    os.symlink(victim, str(output) + ".tmp")  # the temporary name used before the fix
    args = argparse.Namespace(config_file=str(source), output_file=str(output), overwrite=False)
    assert to_fsdp2_command(args) == 0
    assert open(victim).read() == "precious\n"
    assert "fsdp_version: 2" in output.read_text()
    assert os.path.islink(str(output) + ".tmp")  # left alone, not followed
    assert [n for n in os.listdir(output.parent) if n.endswith(".tmp") and n != "fsdp2.yaml.tmp"] == []


def test_replace_file_replaces_a_link_instead_of_following_it(tmp_path, victim) -> None:
    target = tmp_path / "config.yaml"
    os.symlink(victim, target)
    replace_file(target, b"new: 1\n")
    assert not os.path.islink(target) and target.read_bytes() == b"new: 1\n"
    assert open(victim).read() == "precious\n"


def test_the_manifest_temporary_file_is_created_new(tmp_path, victim) -> None:
    """A link planted at the manifest's temporary name in the staging folder is refused, not followed."""
    from accelerando.checkpointing import atomic
    from accelerando.checkpointing.manifest import Manifest

    staging = tmp_path / "staging"
    staging.mkdir()
    os.symlink(victim, staging / (atomic.MANIFEST_NAME + ".tmp"))
    manifest = Manifest(files={}, world_size=1, library_version="test")
    with pytest.raises(FileExistsError):
        atomic.commit(str(staging), str(tmp_path / "final"), manifest, durable=False)
    assert open(victim).read() == "precious\n"


# ---------------------------------------------------------------- (c) ACCELERANDO_CONFIG_FILE


@pytest.mark.parametrize("kind", ["missing", "fifo", "folder"])
def test_a_configured_config_file_that_is_not_a_file_is_one_clear_error(tmp_path, monkeypatch, kind) -> None:
    from accelerando.core.settings.configfile import ConfigError, find_config_file

    path = tmp_path / "config.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    monkeypatch.setenv("ACCELERANDO_CONFIG_FILE", str(path))
    what = {"missing": "does not exist", "fifo": "is a FIFO", "folder": "is a directory"}[kind]
    with pytest.raises(ConfigError, match=rf"Config file .*config\.yaml' {what}.*ACCELERANDO_CONFIG_FILE"):
        find_config_file()
    env = {**os.environ, "ACCELERANDO_CONFIG_FILE": str(path)}
    script = tmp_path / "script.py"
    script.write_text("pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "accelerando", "launch", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode != 0 and what in done.stderr and "Traceback" not in done.stderr, done.stderr[
        -2000:
    ]


def test_dev_null_means_no_config_file(monkeypatch) -> None:
    from accelerando.core.settings.configfile import find_config_file

    monkeypatch.setenv("ACCELERANDO_CONFIG_FILE", os.devnull)
    assert find_config_file() == (None, "")


# ---------------------------------------------------------------- (d) tracker project names


@pytest.mark.parametrize("name", ["../escaped", "a/../../escaped", "/abs/run"])
def test_a_tensorboard_project_name_cannot_leave_logging_dir(tmp_path, name) -> None:
    from accelerando.backends.trackers.tensorboard import TensorBoardTracker

    logs = tmp_path / "logs"
    with pytest.raises(ValueError, match=r"project name .* would write outside logging_dir"):
        TensorBoardTracker(name, logging_dir=str(logs))
    assert not (tmp_path / "escaped").exists()


def test_a_nested_tensorboard_project_name_stays_allowed(tmp_path) -> None:
    from accelerando.backends.trackers.tensorboard import TensorBoardTracker

    tracker = TensorBoardTracker("team/run", logging_dir=str(tmp_path / "logs"))
    assert tracker.logging_dir == os.path.join(str(tmp_path / "logs"), "team/run")
