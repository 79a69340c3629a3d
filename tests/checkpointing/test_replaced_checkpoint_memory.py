"""What a save does with the checkpoint it replaces or rotates out (issue #45).

- Its page cache is dropped before the new files are written, when it was saved durably (clean
  pages: nothing is written back) and is big enough to matter; a scratch save's is left alone.
- It is removed on a thread of its own after the commit; the next save waits for that, and so does a
  normal exit (a plain interpreter and a ``multiprocessing`` child); an ``os._exit`` leaves the
  hidden folder, which the next save removes.

``BACKGROUND_MIN_BYTES`` is lowered so that tiny models stand for big ones; one test keeps it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from safetensors.torch import load_file

from accelerando import Accelerator
from accelerando.checkpointing import atomic, page_cache, removal, verify_checkpoint
from accelerando.plugins.project import ProjectConfiguration


def _tiny(tmp_path, **project) -> tuple[Accelerator, torch.nn.Module]:
    config = ProjectConfiguration(project_dir=str(tmp_path / "project"), **project) if project else None
    accelerator = Accelerator(cpu=True, project_config=config)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accelerator.prepare(model, optimizer)
    return accelerator, model


class _Advice:
    """Records every ``posix_fadvise(DONTNEED)`` (the file's path) and every write into a staging folder."""

    def __init__(self, monkeypatch) -> None:
        self.events: list[tuple[str, str]] = []
        real_advise, real_write = os.posix_fadvise, os.write

        def advise(fd: int, offset: int, length: int, advice: int) -> None:
            if advice == os.POSIX_FADV_DONTNEED:
                self.events.append(("drop", os.readlink(f"/proc/self/fd/{fd}")))
            real_advise(fd, offset, length, advice)

        def write(fd: int, data) -> int:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if ".partial" in target:
                self.events.append(("write", target))
            return real_write(fd, data)

        monkeypatch.setattr(os, "posix_fadvise", advise)
        monkeypatch.setattr(os, "write", write)

    def dropped(self) -> list[str]:
        return [path for kind, path in self.events if kind == "drop"]


def _files(folder: str) -> set[str]:
    return {os.path.join(folder, name) for name in os.listdir(folder)}


def test_a_durable_checkpoint_replaced_is_dropped_from_the_cache_before_the_new_one_is_written(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(removal, "BACKGROUND_MIN_BYTES", 1)
    accelerator, model = _tiny(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    old_files = _files(folder)
    advice = _Advice(monkeypatch)
    with torch.no_grad():
        model.weight.add_(1.0)
    accelerator.save_state(folder)
    monkeypatch.undo()
    assert set(advice.dropped()) == old_files  # every file of the old checkpoint, nothing else
    first_write = next(i for i, (kind, _) in enumerate(advice.events) if kind == "write")
    assert all(kind == "drop" for kind, _ in advice.events[:first_write])  # all before the first write
    assert len(advice.dropped()) == first_write
    verify_checkpoint(folder, checksums=True)  # the new one is whole
    saved = load_file(os.path.join(folder, "model.safetensors"))
    assert torch.equal(saved["weight"], model.weight.detach())  # and it is the new one


def _dirty_pages(path: str) -> int | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        counts = page_cache.cachestat(fd)
    finally:
        os.close(fd)
    return None if counts is None else counts[1] + counts[2]


def test_a_scratch_checkpoint_keeps_its_dirty_pages_and_loses_its_clean_ones(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(removal, "BACKGROUND_MIN_BYTES", 1)
    accelerator, _ = _tiny(tmp_path)
    folder = str(tmp_path / "ckpt")
    weights = os.path.join(folder, "model.safetensors")
    accelerator.save_state(folder, durable=False)
    dirty_before = _dirty_pages(weights)
    if dirty_before is None:
        pytest.skip("this kernel has no cachestat")
    seen: list[tuple[int | None, int]] = []
    accelerator.register_save_state_pre_hook(
        lambda *_: seen.append((_dirty_pages(weights), _resident_pages(weights)))
    )
    advice = _Advice(monkeypatch)
    accelerator.save_state(folder, durable=False)  # replaces a scratch save not written back yet
    if dirty_before:  # (the kernel may have written it back on its own meanwhile: then it is clean)
        assert weights not in advice.dropped()
        assert seen[0][0] == dirty_before and seen[0][1] > 0  # still cached, still dirty: nothing written
    os.sync()  # now it is on disk: its pages are clean
    seen.clear()
    advice.events.clear()
    accelerator.save_state(folder, durable=False)
    assert set(advice.dropped()) == _files(folder)
    assert seen == [(0, 0)]


def test_only_clean_ranges_are_ever_dropped(tmp_path, monkeypatch) -> None:
    """Whatever the kernel says, a range is dropped only when cachestat found it cached and clean."""
    monkeypatch.setattr(removal, "BACKGROUND_MIN_BYTES", 1)
    monkeypatch.setattr(page_cache, "RANGE_BYTES", 4096)
    accelerator, _ = _tiny(tmp_path)
    folder = str(tmp_path / "ckpt")
    answers: list[tuple[int, int, tuple[int, int, int] | None]] = []
    real = page_cache.cachestat

    def recording(fd: int, offset: int = 0, length: int = 0) -> tuple[int, int, int] | None:
        counts = real(fd, offset, length)
        answers.append((os.fstat(fd).st_ino, offset, counts))
        return counts

    drops: list[tuple[int, int]] = []
    real_advise = os.posix_fadvise

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_DONTNEED:
            drops.append((os.fstat(fd).st_ino, offset))
        real_advise(fd, offset, length, advice)

    monkeypatch.setattr(page_cache, "cachestat", recording)
    monkeypatch.setattr(os, "posix_fadvise", advise)
    for durable in (False, True, False, False):
        accelerator.save_state(folder, durable=durable)
    if any(counts is None for _, _, counts in answers):
        pytest.skip("this kernel has no cachestat")
    clean = {
        (ino, offset) for ino, offset, counts in answers if counts and counts[0] and not counts[1] + counts[2]
    }
    assert drops and set(drops) <= clean


def test_without_cachestat_only_a_durable_checkpoint_is_dropped(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(removal, "BACKGROUND_MIN_BYTES", 1)
    monkeypatch.setattr(page_cache, "cachestat", lambda *_: None)
    accelerator, _ = _tiny(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder, durable=False)
    advice = _Advice(monkeypatch)
    accelerator.save_state(folder)  # replaces a scratch save: nothing known to be clean
    assert advice.dropped() == []
    accelerator.save_state(folder, durable=False)  # replaces a durable one: dropped whole
    assert set(advice.dropped()) == _files(folder)


def test_a_small_checkpoint_replaced_is_left_cached(tmp_path, monkeypatch) -> None:
    accelerator, _ = _tiny(tmp_path)  # 4x64x64 floats: far under BACKGROUND_MIN_BYTES
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    advice = _Advice(monkeypatch)
    started: list[str] = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name) or real_start(self))
    accelerator.save_state(folder)
    monkeypatch.undo()
    assert advice.dropped() == [] and started == []
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []  # removed in line


def test_rotated_out_checkpoints_are_dropped_before_writing_and_removed_after(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(removal, "BACKGROUND_MIN_BYTES", 1)
    accelerator, _ = _tiny(tmp_path, automatic_checkpoint_naming=True, total_limit=2)
    for _ in range(2):
        accelerator.save_state()
    root = str(tmp_path / "project" / "checkpoints")
    oldest = os.path.join(root, "checkpoint_0")
    oldest_files = _files(oldest)
    advice = _Advice(monkeypatch)
    accelerator.save_state()  # checkpoint_2: checkpoint_0 goes
    monkeypatch.undo()
    assert set(advice.dropped()) == oldest_files
    first_write = next(i for i, (kind, _) in enumerate(advice.events) if kind == "write")
    assert len(advice.dropped()) == first_write
    atomic.wait_for_removals()
    assert [n for n, _ in atomic.list_checkpoints(root)] == [1, 2]
    assert [name for name in os.listdir(root) if name.startswith(".")] == []


def _resident_pages(path: str) -> int:
    """Pages of ``path`` in the page cache (``mincore`` on a mapping of it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        first = ctypes.c_char.from_buffer(mapped)  # an export of the mapping: released before it closes
        try:
            result = libc.mincore(ctypes.c_void_p(ctypes.addressof(first)), ctypes.c_size_t(size), vector)
        finally:
            del first
    if result != 0:
        pytest.skip(f"mincore failed: {os.strerror(ctypes.get_errno())}")
    return sum(byte & 1 for byte in vector)


def test_the_kernel_really_drops_the_replaced_checkpoint(tmp_path) -> None:
    """With the real threshold: a 64 MiB model's checkpoint, replaced by a save of the same folder, has
    none of its pages cached while the new one is being written (checked from a save hook, which runs
    after the drop and before the commit).
    """
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, bias=False) for _ in range(4)])  # 64 MiB
    accelerator.prepare(model)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    weights = os.path.join(folder, "model.safetensors")
    with open(weights, "rb") as handle:  # every page cached
        while handle.read(1 << 24):
            pass
    before = _resident_pages(weights)
    if before == 0:
        pytest.skip("this file system keeps no page cache of its files")
    seen: list[int] = []

    def hook(models, weights_list, output_dir) -> None:
        seen.append(_resident_pages(weights))  # the old checkpoint, still whole on disk

    accelerator.register_save_state_pre_hook(hook)
    accelerator.save_state(folder)
    assert seen and seen[0] < before // 10, (before, seen)
    verify_checkpoint(folder, checksums=True)


_CHILD = textwrap.dedent(
    """
    import os, sys, torch
    from accelerando import Accelerator
    from accelerando.checkpointing import atomic, removal
    removal.BACKGROUND_MIN_BYTES = 1
    folder = sys.argv[1]
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(64, 64))
    accelerator.save_state(folder)
    accelerator.save_state(folder)  # the first one is removed on a thread
    print("pending", sum(t.name == "accelerando-remove" for t in __import__("threading").enumerate()), flush=True)
    if sys.argv[2] == "os_exit":
        os._exit(0)
    """
)

_FORKED_CHILD = textwrap.dedent(
    """
    import multiprocessing, sys, torch
    from accelerando import Accelerator
    from accelerando.checkpointing import atomic, removal

    def save_twice(folder):
        removal.BACKGROUND_MIN_BYTES = 1
        accelerator = Accelerator(cpu=True)
        accelerator.prepare(torch.nn.Linear(64, 64))
        accelerator.save_state(folder)
        accelerator.save_state(folder)  # the child then ends through os._exit, after its threads

    child = multiprocessing.get_context("fork").Process(target=save_twice, args=(sys.argv[1],))
    child.start()
    child.join(timeout=120)
    sys.exit(child.exitcode)
    """
)


def _run_saving_child(script: str, folder: str, *args: str) -> None:
    """Run ``script`` in a fresh interpreter; it must exit 0 leaving a whole checkpoint in ``folder``."""
    done = subprocess.run(
        [sys.executable, "-c", script, folder, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    verify_checkpoint(folder, checksums=True)


def _hidden(folder: str) -> list[str]:
    return [name for name in os.listdir(os.path.dirname(folder)) if name.startswith(".")]


@pytest.mark.parametrize("ending", ["normal", "os_exit"])
def test_a_process_that_exits_leaves_no_replaced_folder_unless_killed(tmp_path, ending: str) -> None:
    folder = str(tmp_path / "ckpt")
    _run_saving_child(_CHILD, folder, ending)
    if ending == "normal":
        assert _hidden(folder) == []
        return
    # os._exit may leave the replaced folder under its hidden name (the removal raced the exit)
    assert all(".partial" in name or ".trash-" in name for name in _hidden(folder))
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(64, 64))
    accelerator.save_state(folder)  # the next save of that folder removes what was left
    atomic.wait_for_removals()
    assert _hidden(folder) == []


def test_a_multiprocessing_child_waits_for_its_removal(tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    _run_saving_child(_FORKED_CHILD, folder)
    assert _hidden(folder) == []


def test_links_and_fifos_planted_in_the_replaced_checkpoint_are_not_followed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(removal, "BACKGROUND_MIN_BYTES", 1)
    accelerator, _ = _tiny(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(os.urandom(1 << 20))
    os.sync()
    outside.read_bytes()  # cached, clean
    cached_before = _resident_pages(str(outside))
    os.symlink(outside, os.path.join(folder, "planted_link.bin"))
    os.mkfifo(os.path.join(folder, "planted_fifo"))
    advice = _Advice(monkeypatch)
    accelerator.save_state(folder)  # must neither block on the FIFO nor drop the link's target
    monkeypatch.undo()
    dropped = {os.path.basename(path) for path in advice.dropped()}
    assert dropped and not dropped & {"planted_link.bin", "planted_fifo", "outside.bin"}
    assert cached_before > 0 and _resident_pages(str(outside)) == cached_before
    atomic.wait_for_removals()
    assert outside.exists() and _hidden(folder) == []
    verify_checkpoint(folder, checksums=True)


def test_cachestat_is_never_called_on_a_machine_whose_syscall_numbers_differ(monkeypatch) -> None:
    real_uname = os.uname()
    fake = os.uname_result((real_uname.sysname, "n", "6.18", "v", "mips64"))
    monkeypatch.setattr(os, "uname", lambda: fake)
    monkeypatch.setattr(page_cache, "_SYSCALL", [])
    fd = os.open(__file__, os.O_RDONLY)
    try:
        assert page_cache.cachestat(fd) is None
    finally:
        os.close(fd)


_SCRATCH_ONLY_CHILD = textwrap.dedent(
    """
    import sys, threading, torch
    from accelerando import Accelerator
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(4, 2))
    for _ in range(3):
        accelerator.save_state(sys.argv[1], durable=False)  # the later ones replace the first
    print(sorted(thread.name for thread in threading.enumerate()))
    """
)


def test_a_fresh_process_making_scratch_saves_starts_no_thread(tmp_path) -> None:
    """In a fresh interpreter (no pool left by another test), replacing a small scratch checkpoint
    unlinks its files in line: no flush pool, no removal thread.
    """
    folder = str(tmp_path / "ckpt")
    done = subprocess.run(
        [sys.executable, "-c", _SCRATCH_ONLY_CHILD, folder],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['MainThread']"
    assert _hidden(folder) == []
