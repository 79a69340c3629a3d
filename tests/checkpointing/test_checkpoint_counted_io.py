"""Counted work of ``save_state`` and ``load_state``: fsync calls and bytes written or read, against
what the raw floor does.

The raw floor of a durable save is each file written once and flushed once. ``save_state`` adds the
manifest and one flush per folder it changes (the staging folder, its parent), and no more:
overwriting a checkpoint or rotating old ones away adds at most one flush of the parent folder, and
every payload byte is written once, hashed for the manifest as it is written (never read back).
A load reads each file it needs once: the bytes whose checksum is verified are those deserialized.
"""

from __future__ import annotations

import mmap
import os

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import CheckpointError, atomic, list_checkpoints, verify_checkpoint
from accelerando.checkpointing.digest import PIECE_BYTES, available, file_digest
from accelerando.checkpointing.written import StreamDigest
from accelerando.plugins.project import ProjectConfiguration

pytestmark = pytest.mark.usefixtures("fresh_state")


def _prepared(tmp_path, **config: object) -> Accelerator:
    accelerator = Accelerator(
        cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path), **config)
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 256)).sum().backward()
    optimizer.step()
    return accelerator


def _written_bytes() -> int:
    with open("/proc/self/io", encoding="ascii") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["wchar"])


def test_overwriting_a_checkpoint_flushes_each_folder_once(tmp_path, fsyncs) -> None:
    accelerator = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    fsyncs.paths.clear()
    accelerator.save_state(folder)  # the atomic swap, then the previous checkpoint goes to the trash
    files = verify_checkpoint(folder).files
    # Each file, the manifest, the staging folder, the parent: moving the old one away adds none.
    assert len(fsyncs.paths) == len(files) + 3, fsyncs.paths
    assert fsyncs.paths[-1] == str(tmp_path)
    atomic.wait_for_removals()  # the replaced folder is removed in the background
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_rotation_flushes_the_checkpoints_folder_once_for_all_deletions(tmp_path, fsyncs) -> None:
    accelerator = _prepared(tmp_path, automatic_checkpoint_naming=True, total_limit=3)
    for _ in range(3):
        accelerator.save_state()
    accelerator.project_configuration.total_limit = 1
    fsyncs.paths.clear()
    accelerator.save_state()  # checkpoint_3; rotation deletes checkpoint_0, _1 and _2
    root = str(tmp_path / "checkpoints")
    assert [n for n, _ in list_checkpoints(root)] == [3]
    files = verify_checkpoint(os.path.join(root, "checkpoint_3")).files
    # The save's own flushes, then one flush of the checkpoints folder for the three deletions.
    assert len(fsyncs.paths) == len(files) + 4, fsyncs.paths
    assert fsyncs.paths[-2:] == [root, root]
    atomic.wait_for_removals()  # rotated-out folders are removed in the background
    assert not [name for name in os.listdir(root) if name.startswith(".checkpoint_")]  # no trash left


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")
def test_a_save_writes_each_payload_byte_once(tmp_path) -> None:
    accelerator = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)  # first save: imports and lazy set-up are done
    before = _written_bytes()
    accelerator.save_state(str(tmp_path / "second"))
    written = _written_bytes() - before
    payload = sum(entry.size for entry in verify_checkpoint(str(tmp_path / "second")).files.values())
    manifest = os.path.getsize(tmp_path / "second" / "checkpoint_manifest.json")
    assert payload > 700_000  # weights + AdamW state of a 256 x 256 layer
    # The files once, the manifest once, the lock's 512-byte record: nothing written twice.
    assert payload + manifest <= written <= payload + manifest + 4096, (written, payload, manifest)


def test_a_save_hashes_while_writing_and_reads_no_file_back(tmp_path, monkeypatch) -> None:
    accelerator = _prepared(tmp_path)
    accelerator.save_state(str(tmp_path / "first"))  # imports and lazy set-up are done
    reads: list[str] = []
    real_mmap, real_pread = mmap.mmap, os.pread

    def counting_mmap(fd: int, *args: object, **kwargs: object) -> mmap.mmap:
        reads.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_mmap(fd, *args, **kwargs)

    def counting_pread(fd: int, size: int, offset: int) -> bytes:
        reads.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(mmap, "mmap", counting_mmap)
    monkeypatch.setattr(os, "pread", counting_pread)
    folder = str(tmp_path / "second")
    accelerator.save_state(folder)
    monkeypatch.undo()
    assert reads == []
    # The checksums computed while writing are those of the bytes on disk.
    files = verify_checkpoint(folder, checksums=True).files
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= set(files)


@pytest.mark.parametrize("algorithm", ["xxh3_64-p64m", "crc32-p64m"])
def test_stream_digest_equals_the_digest_of_the_file(tmp_path, algorithm) -> None:
    if not available(algorithm):
        pytest.skip(f"{algorithm} needs xxhash")
    data = os.urandom(1 << 16) * (PIECE_BYTES // (1 << 16) + 1)  # a bit over one piece
    for size in (0, 1, PIECE_BYTES, len(data)):
        path = tmp_path / f"f{size}"
        path.write_bytes(data[:size])
        stream = StreamDigest(algorithm)
        for start in range(0, size, 3 * 2**20 + 7):  # chunks that straddle the piece boundary
            stream.update(memoryview(data)[start : min(size, start + 3 * 2**20 + 7)])
        assert stream.entry() == file_digest(str(path), algorithm), size


def _read_bytes() -> int:
    with open("/proc/self/io", encoding="ascii") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["rchar"])


class _LoadReads:
    """Every way the load could read a checkpoint file's bytes: memory maps made from Python (path and
    length), maps made by torch or safetensors themselves (which read nothing through read(2)), and
    the bytes read(2) returned to this process (``rchar``, any thread, C++ readers included)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import safetensors.torch

        self.mapped: list[tuple[str, int]] = []
        self.other_maps: list[str] = []
        real_mmap, real_from_file = mmap.mmap, torch.UntypedStorage.from_file
        real_safe_open = safetensors.torch.safe_open

        def counting_mmap(fd: int, length: int, *args: object, **kwargs: object) -> mmap.mmap:
            mapped = real_mmap(fd, length, *args, **kwargs)
            self.mapped.append((os.readlink(f"/proc/self/fd/{fd}"), len(mapped)))
            return mapped

        def counting_from_file(path: str, *args: object, **kwargs: object) -> torch.UntypedStorage:
            self.other_maps.append(f"torch.UntypedStorage.from_file({path})")
            return real_from_file(path, *args, **kwargs)

        def counting_safe_open(path: str, *args: object, **kwargs: object) -> object:
            self.other_maps.append(f"safetensors.safe_open({path})")
            return real_safe_open(path, *args, **kwargs)

        monkeypatch.setattr(mmap, "mmap", counting_mmap)
        monkeypatch.setattr(torch.UntypedStorage, "from_file", counting_from_file)
        monkeypatch.setattr(safetensors.torch, "safe_open", counting_safe_open)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")
@pytest.mark.parametrize("size", ["small files", "mapped optimizer"])
def test_a_load_reads_each_file_once(tmp_path, monkeypatch, size: str) -> None:
    from accelerando.checkpointing import files, sources

    if size == "mapped optimizer":  # big files are mapped; their tensors are views of the map (no copy)
        monkeypatch.setattr(files, "MAPPED_LOAD_MIN_BYTES", 1)
        monkeypatch.setattr(sources, "PRIVATE_READ_MAX_BYTES", 0)
    private = sources.PRIVATE_READ_MAX_BYTES
    accelerator = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    accelerator.load_state(folder)  # imports and lazy set-up are done
    manifest = verify_checkpoint(folder)
    sizes = {os.path.join(folder, name): entry.size for name, entry in manifest.files.items()}
    assert sum(sizes.values()) > 700_000  # weights + AdamW state of a 256 x 256 layer
    reads = _LoadReads(monkeypatch)
    before = _read_bytes()
    accelerator.load_state(folder)  # checksums verified (the default)
    read = _read_bytes() - before
    monkeypatch.undo()
    # Each big file mapped once, whole; its checksum and its tensors both come from that one map.
    mapped = {path: n for path, n in sizes.items() if n > private}
    assert sorted(reads.mapped) == sorted(mapped.items()), reads.mapped
    assert reads.other_maps == []
    # Each small file read(2) once into private memory (its checksum and its objects come from that
    # copy); nothing else but the manifest (and this process's own /proc files).
    read_once = sum(n for n in sizes.values() if n <= private)
    manifest_size = os.path.getsize(os.path.join(folder, "checkpoint_manifest.json"))
    assert read_once + manifest_size <= read <= read_once + manifest_size + 4096, (read, read_once)


def _flip_a_tensor_byte(path: str) -> None:
    """Flip one bit of a byte inside the tensor data: size and zip structure stay intact."""
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x01]))


def test_a_flipped_byte_is_refused_by_its_checksum_before_anything_is_applied(tmp_path) -> None:
    accelerator = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    _flip_a_tensor_byte(os.path.join(folder, "optimizer.bin"))
    model = accelerator._models[0]
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(5.0)
    with pytest.raises(CheckpointError, match=r"optimizer\.bin' fails its .* checksum"):
        accelerator.load_state(folder)
    assert all(bool((param == 5.0).all()) for param in model.parameters())  # nothing applied


def _record_calls(monkeypatch, calls: list[str]) -> None:
    """Record, in order, when deserializing starts and when the checksums are compared."""
    import accelerando.checkpointing.load as load_module
    from accelerando.checkpointing.sources import CheckedFiles

    read_state_files, verify = load_module.read_state_files, CheckedFiles.verify

    def recorded_read(*args: object, **kwargs: object) -> object:
        calls.append("deserialize")
        return read_state_files(*args, **kwargs)  # type: ignore[arg-type]

    def recorded_verify(self: CheckedFiles) -> dict[str, memoryview]:
        calls.append("verify")
        return verify(self)

    monkeypatch.setattr(load_module, "read_state_files", recorded_read)
    monkeypatch.setattr(CheckedFiles, "verify", recorded_verify)


def test_weights_only_deserializing_overlaps_the_checksums_and_applies_after_them(
    tmp_path, monkeypatch
) -> None:
    accelerator = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    saved = [param.detach().clone() for param in accelerator._models[0].parameters()]
    calls: list[str] = []
    _record_calls(monkeypatch, calls)
    with torch.no_grad():
        for param in accelerator._models[0].parameters():
            param.fill_(5.0)
    accelerator.load_state(folder)
    # The hashing runs while the bytes are deserialized; the comparison comes before anything is applied.
    assert calls == ["deserialize", "verify"]
    assert all(torch.equal(a, b) for a, b in zip(accelerator._models[0].parameters(), saved, strict=True))


def test_full_unpickling_waits_for_the_checksums(tmp_path, monkeypatch) -> None:
    accelerator = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    _flip_a_tensor_byte(os.path.join(folder, "optimizer.bin"))
    calls: list[str] = []
    _record_calls(monkeypatch, calls)
    # Opted in to running the file's code: nothing of it is unpickled before its checksum matched.
    with pytest.raises(CheckpointError, match=r"optimizer\.bin' fails its .* checksum"):
        accelerator.load_state(folder, load_kwargs={"weights_only": False})
    assert calls == ["verify"]


@pytest.mark.parametrize("where", ["header", "end"])
def test_a_parse_error_of_damaged_bytes_is_named_by_the_checksum(tmp_path, where: str) -> None:
    accelerator = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    for name in ("model.safetensors", "optimizer.bin"):
        path = os.path.join(folder, name)
        with open(path, "r+b") as handle:  # the safetensors header length or zip records: unparsable
            handle.seek(0 if where == "header" else os.path.getsize(path) - 3)
            handle.write(b"\xff\xff\xff")
    with pytest.raises(CheckpointError, match=r"model\.safetensors' fails its .* checksum") as caught:
        accelerator.load_state(folder)
    if where == "header":  # the safetensors header cannot be parsed: that error is not what the user sees
        assert caught.value.__suppress_context__


def test_a_parse_error_of_intact_bytes_is_raised_as_it_is(tmp_path, monkeypatch) -> None:
    import accelerando.checkpointing.files as files

    accelerator = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)

    def refuse(*_: object, **__: object) -> object:
        raise ValueError("this torch cannot read it")

    monkeypatch.setattr(files, "load_model_weights", refuse)
    with pytest.raises(ValueError, match="this torch cannot read it"):
        accelerator.load_state(folder)


@pytest.mark.parametrize("local_processes", [None, "2"])
def test_the_weights_are_copied_on_this_processs_share_of_the_cores(
    tmp_path, monkeypatch, local_processes
) -> None:
    from accelerando.checkpointing.workers import MAX_THREADS, usable_cores

    accelerator = _prepared(tmp_path)
    if local_processes is not None:  # as the cluster environment of a 2-process launch reports it
        from accelerando.core.runtime import current_process

        process = current_process()
        assert process is not None
        monkeypatch.setattr(
            type(process.cluster), "local_world_size", property(lambda _: int(local_processes))
        )
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    seen: list[int] = []
    model = accelerator._models[0]
    handle = model.register_load_state_dict_post_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as a launcher's OMP_NUM_THREADS=1 leaves it
    try:
        accelerator.load_state(folder)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
        handle.remove()
    share = usable_cores() // int(local_processes or 1)
    assert seen == [max(1, min(MAX_THREADS, share))]  # the copies into the parameters
    assert after == 1  # the user's setting is back once the load is done
