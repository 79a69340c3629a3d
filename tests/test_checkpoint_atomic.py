"""The crash-safe commit machinery: staging, manifest, atomic rename, rotation, verification."""

from __future__ import annotations

import json
import os

import pytest

from accelerando.checkpointing import atomic


def _commit(final: str, files: dict[str, bytes], world_size: int = 1) -> str:
    staging = atomic.prepare_staging(final)
    for name, data in files.items():
        with open(os.path.join(staging, name), "wb") as handle:
            handle.write(data)
    entries = atomic.describe_files(staging, list(files))
    atomic.commit(staging, final, atomic.Manifest(entries, world_size, "test"))
    return final


def test_commit_makes_folder_visible_only_when_complete(tmp_path) -> None:
    root = tmp_path / "checkpoints"
    final = str(root / "checkpoint_0")
    staging = atomic.prepare_staging(final)
    (tmp_path / "checkpoints" / ".checkpoint_0.partial" / "a.bin").write_bytes(b"x")
    assert atomic.list_checkpoints(str(root)) == []  # staged, invisible
    entries = atomic.describe_files(staging, ["a.bin"])
    assert entries["a.bin"].size == 1
    atomic.commit(staging, final, atomic.Manifest(entries, 2, "0.0"))
    assert atomic.list_checkpoints(str(root)) == [(0, final)]
    assert not os.path.exists(staging)
    manifest = atomic.verify_checkpoint(final, checksums=True)
    assert manifest.world_size == 2 and set(manifest.files) == {"a.bin"}
    payload = json.loads((root / "checkpoint_0" / atomic.MANIFEST_NAME).read_text())
    assert payload["files"]["a.bin"]["size"] == 1


def test_commit_replaces_existing_folder(tmp_path) -> None:
    final = str(tmp_path / "ckpt")
    _commit(final, {"a.bin": b"old"})
    _commit(final, {"b.bin": b"new"})
    assert sorted(os.listdir(final)) == sorted([atomic.MANIFEST_NAME, "b.bin"])
    assert [n for n in os.listdir(tmp_path) if n != "ckpt"] == []  # no trash left


@pytest.mark.parametrize("damage", ["truncate", "delete", "flip", "manifest"])
def test_damage_is_named(tmp_path, damage: str) -> None:
    final = _commit(str(tmp_path / "ckpt"), {"weights.bin": bytes(range(256)) * 8, "b.bin": b"ok"})
    target = os.path.join(final, "weights.bin")
    if damage == "truncate":
        os.truncate(target, 100)
    elif damage == "delete":
        os.remove(target)
    elif damage == "flip":
        with open(target, "r+b") as handle:
            handle.seek(77)
            byte = handle.read(1)
            handle.seek(77)
            handle.write(bytes([byte[0] ^ 0xFF]))
    else:
        target = os.path.join(final, atomic.MANIFEST_NAME)
        with open(target, "w") as handle:
            handle.write("{not json")
    name = os.path.basename(target)
    if damage == "flip":
        atomic.verify_checkpoint(final)  # sizes alone cannot see a flipped byte
    with pytest.raises(atomic.CheckpointError, match=name):
        atomic.verify_checkpoint(final, checksums=True)


def test_checksum_verifier_reports_in_result(tmp_path) -> None:
    final = _commit(str(tmp_path / "ckpt"), {"a.bin": b"abcdef"})
    manifest = atomic.read_manifest(final)
    atomic.ChecksumVerifier(final, manifest, ["a.bin"]).result()
    with open(os.path.join(final, "a.bin"), "r+b") as handle:
        handle.write(b"X")
    with pytest.raises(atomic.CheckpointError, match="a.bin"):
        atomic.ChecksumVerifier(final, manifest, ["a.bin"]).result()


def test_rotation_deletes_oldest_only(tmp_path) -> None:
    root = tmp_path / "checkpoints"
    for n in range(5):
        _commit(str(root / f"checkpoint_{n}"), {"a": bytes([n])})
    (root / "checkpoint_9").mkdir()  # no manifest: not a complete checkpoint, not counted
    deleted = atomic.rotate(str(root), 2)
    assert [os.path.basename(p) for p in deleted] == ["checkpoint_0", "checkpoint_1", "checkpoint_2"]
    assert [n for n, _ in atomic.list_checkpoints(str(root))] == [3, 4]
    assert atomic.rotate(str(root), None) == []


def test_remove_stale_cleans_partial_and_trash(tmp_path) -> None:
    (tmp_path / ".checkpoint_3.partial").mkdir()
    (tmp_path / ".checkpoint_1.trash-abcd").mkdir()
    (tmp_path / ".keep").mkdir()
    (tmp_path / ".download.partial").mkdir()  # someone else's: left alone
    atomic.remove_stale(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [".download.partial", ".keep"]
    atomic.remove_stale(str(tmp_path), "download")
    assert sorted(os.listdir(tmp_path)) == [".keep"]


def test_missing_manifest_is_reported(tmp_path) -> None:
    with pytest.raises(atomic.CheckpointError, match="incomplete"):
        atomic.read_manifest(str(tmp_path))


@pytest.mark.parametrize("algorithm", ["crc32", "xxh3_64"])
def test_both_checksum_algorithms_detect_a_flip(tmp_path, algorithm: str) -> None:
    if algorithm == "xxh3_64":
        pytest.importorskip("xxhash")
    folder = tmp_path / "ckpt"
    staging = atomic.prepare_staging(str(folder))
    (tmp_path / ".ckpt.partial" / "a.bin").write_bytes(bytes(1000))
    entry = atomic.file_digest(os.path.join(staging, "a.bin"), algorithm)
    assert entry.algorithm == algorithm and entry.size == 1000
    atomic.commit(staging, str(folder), atomic.Manifest({"a.bin": entry}, 1, "test"))
    atomic.verify_checkpoint(str(folder), checksums=True)
    (folder / "a.bin").write_bytes(bytes(999) + b"\x01")
    with pytest.raises(atomic.CheckpointError, match=f"a.bin.*{algorithm}"):
        atomic.verify_checkpoint(str(folder), checksums=True)


def test_unknown_algorithm_is_refused(tmp_path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(ValueError, match="not available"):
        atomic.file_digest(str(tmp_path / "f"), "md4")


def test_mapped_and_read_hashing_agree(tmp_path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(3 * 2**20 + 5))
    entry = atomic.file_digest(str(path))
    hasher = atomic._hasher(entry.algorithm)
    with open(path, "rb") as handle:
        assert atomic._hash_read(handle, hasher) == entry.size
    assert hasher.intdigest() == entry.checksum
    (tmp_path / "empty").write_bytes(b"")
    assert atomic.file_digest(str(tmp_path / "empty")).size == 0
