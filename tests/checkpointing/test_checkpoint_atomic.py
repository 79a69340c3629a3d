"""The crash-safe commit machinery: staging, manifest, atomic rename, rotation, verification."""

from __future__ import annotations

import json
import os
import zlib

import pytest

from accelerando.checkpointing import atomic, digest


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
    atomic.wait_for_removals()  # the replaced folder is removed in the background
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


def test_parallel_verification_names_the_damaged_file_among_many(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(digest, "PIECE_BYTES", 4096)  # many pieces per file, hashed by the pool at once
    files = {f"f{i}.bin": os.urandom(4096 * i + 7) for i in range(6)}
    final = _commit(str(tmp_path / "ckpt"), files)
    assert atomic.verify_checkpoint(final, checksums=True).files["f5.bin"].size == 4096 * 5 + 7
    with open(os.path.join(final, "f3.bin"), "r+b") as handle:
        handle.seek(4096 * 2 + 1)  # inside the third piece
        byte = handle.read(1)
        handle.seek(4096 * 2 + 1)
        handle.write(bytes([byte[0] ^ 1]))
    with pytest.raises(atomic.CheckpointError, match="f3.bin"):
        atomic.verify_checkpoint(final, checksums=True)
    atomic.verify_checkpoint(final, checksums=True, names=["f1.bin", "f4.bin"])  # only those are read


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


@pytest.mark.parametrize("algorithm", ["crc32", "xxh3_64", "crc32-p64m", "xxh3_64-p64m"])
def test_every_checksum_algorithm_detects_a_flip(tmp_path, algorithm: str) -> None:
    if algorithm.startswith("xxh3_64"):
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


def test_pieced_digest_is_the_digest_of_piece_digests(tmp_path, monkeypatch) -> None:
    xxhash = pytest.importorskip("xxhash")
    monkeypatch.setattr(digest, "PIECE_BYTES", 1 << 20)
    data = os.urandom(3 * 2**20 + 5)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    pieces = [data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    expected = xxhash.xxh3_64_intdigest(
        b"".join(xxhash.xxh3_64_intdigest(p).to_bytes(8, "little") for p in pieces)
    )
    mapped = atomic.file_digest(str(path), "xxh3_64-p64m")
    assert (mapped.size, mapped.checksum) == (len(data), expected)
    assert atomic.file_digest(str(path), "xxh3_64").checksum == xxhash.xxh3_64_intdigest(data)
    assert atomic.file_digest(str(path), "crc32").checksum == zlib.crc32(data)

    def no_mmap(*args, **kwargs):
        raise OSError("this file system cannot map files")

    monkeypatch.setattr(digest.mmap, "mmap", no_mmap)  # the pread path must give the same digests
    for algorithm in ("xxh3_64-p64m", "xxh3_64", "crc32", "crc32-p64m"):
        assert atomic.file_digest(str(path), algorithm) == digest.digest_files([(str(path), algorithm)])[0]
    assert atomic.file_digest(str(path), "xxh3_64-p64m") == mapped
    (tmp_path / "empty").write_bytes(b"")
    assert atomic.file_digest(str(tmp_path / "empty")).size == 0


def test_file_describer_hashes_files_and_flushes_each_once(tmp_path, monkeypatch) -> None:
    flushed: list[str] = []
    real_fsync = atomic.fsync_file
    monkeypatch.setattr(
        atomic, "fsync_file", lambda path: (flushed.append(os.path.basename(path)), real_fsync(path))
    )
    describer = atomic.FileDescriber(str(tmp_path))
    for i in range(3):
        (tmp_path / f"f{i}").write_bytes(os.urandom(1000 * (i + 1)))
        describer.add(f"f{i}")  # handed over before the next file exists
    entries = describer.finish()  # flushed together, at once
    assert sorted(flushed) == ["f0", "f1", "f2"]
    assert entries == {f"f{i}": atomic.file_digest(str(tmp_path / f"f{i}")) for i in range(3)}
    describer.close()  # idempotent

    failing = atomic.FileDescriber(str(tmp_path))
    failing.add("f0")
    with pytest.raises(FileNotFoundError):
        failing.add("missing")
    failing.close()  # releases the open files after a failure


def test_state_files_are_handed_over_complete_one_by_one(tmp_path) -> None:
    import torch

    from accelerando.checkpointing.state_io import write_state_files

    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    sizes: dict[str, int] = {}
    names = write_state_files(
        str(tmp_path),
        [model.state_dict()],
        [optimizer],
        [],
        [],
        0,
        3,
        on_written=lambda name: sizes.setdefault(name, os.path.getsize(tmp_path / name)),
    )
    assert list(sizes) == names == ["model.safetensors", "optimizer.bin", "random_states_0.pkl"]
    assert sizes == {name: os.path.getsize(tmp_path / name) for name in names}


def test_digests_work_in_a_forked_child_after_the_parent_used_the_pool(tmp_path) -> None:
    import multiprocessing as mp

    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(10_000))
    expected = atomic.file_digest(str(path))  # the parent's pool now has threads
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        child = pool.apply_async(atomic.file_digest, (str(path),)).get(timeout=60)
    assert child == expected


def test_big_verifications_show_a_progress_bar_in_bytes(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("tqdm")
    monkeypatch.setattr(digest, "PIECE_BYTES", 4096)
    files = {"a.bin": os.urandom(4096 * 3), "b.bin": os.urandom(100)}
    final = _commit(str(tmp_path / "checkpoint_7"), files)
    capsys.readouterr()
    monkeypatch.setattr(digest, "PROGRESS_MIN_BYTES", 1)
    atomic.verify_checkpoint(final, checksums=True)
    err = capsys.readouterr().err
    assert "Verifying checkpoint_7" in err and "12.4k" in err  # 4096 * 3 + 100 bytes, in tqdm's units
    monkeypatch.setattr(digest, "PROGRESS_MIN_BYTES", 10**9)
    atomic.verify_checkpoint(final, checksums=True)
    assert "Verifying" not in capsys.readouterr().err  # small checks stay quiet
