"""Issue 41 item 4: the bytes whose checksum was verified are the bytes applied.

A checkpoint file changed in place (rewritten, truncated, truncated and regrown) after its checksum
passed is refused with one line naming it, and the model and optimizer keep exactly the values they
had (nothing half-applied); a truncation is that error, not ``SIGBUS``. The trials hook the load at
three points between the checksums passing and the apply (right after ``CheckedFiles.verify``
returned, after this process read and checked everything, and after every process agreed, before
``apply_state``) and run in forked children of
``changed_files_worker.py``, so a crash is counted instead of ending the test run. Before the fix,
all 18 trials of the slow test applied unverified bytes (12) or died of SIGBUS (6).

In-process: a small file is read into private memory (a rewrite after its checksum cannot reach
what is applied), the explicit ``load_accelerator_state`` form refuses as ``load_state`` does, and
a rewrite racing with the apply itself (the documented limit) is reported after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

import accelerando.checkpointing.state_io as state_io
from accelerando import Accelerator
from accelerando.checkpointing import load_accelerator_state
from accelerando.checkpointing.manifest import CheckpointError
from accelerando.checkpointing.sources import PRIVATE_READ_MAX_BYTES, CheckedFiles
from suite_support import reset_accelerator_state

pytestmark = pytest.mark.usefixtures("fresh_state")

WORKER = os.path.join(os.path.dirname(__file__), "changed_files_worker.py")
POINTS = ("verify", "read", "apply")
FILES = ("model.safetensors", "optimizer.bin")
CHANGES = ("rewrite", "truncate", "regrow")


def _trials(tmp_path, specs: list[dict]) -> list[dict]:
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, WORKER, str(work), json.dumps(specs)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert results[0]["outcome"] == "saved", results[0]
    return results[1:]


def _assert_refused(results: list[dict], count: int) -> None:
    assert len(results) == count
    bad = [r for r in results if r["outcome"] != "refused"]
    assert not bad, bad  # none applied unverified bytes, none crashed
    for result in results:
        message = result["error"]
        assert message.startswith("CheckpointError: "), message
        assert result["trial"]["file"] in message and "changed on disk" in message, message
        assert "nothing was applied" in message and "\n" not in message, message


def test_changed_files_are_refused_before_anything_is_applied(tmp_path) -> None:
    """One trial per point and file, each change twice: all refused, objects untouched, no SIGBUS."""
    specs = [
        {"point": point, "file": name, "change": CHANGES[(i + j) % 3]}
        for i, point in enumerate(POINTS)
        for j, name in enumerate(FILES)
    ]
    _assert_refused(_trials(tmp_path, specs), len(specs))


@pytest.mark.slow
def test_every_change_at_every_point_is_refused(tmp_path) -> None:
    """All 18 combinations (3 points x 2 files x 3 changes): 0 applied unverified bytes, 0 crashed."""
    specs = [
        {"point": point, "file": name, "change": change}
        for point in POINTS
        for name in FILES
        for change in CHANGES
    ]
    _assert_refused(_trials(tmp_path, specs), len(specs))


def _saved_and_fresh(folder: str, side: int) -> tuple[Accelerator, torch.nn.Module, torch.Tensor]:
    reset_accelerator_state()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = accelerator.prepare(torch.nn.Linear(side, side))
    accelerator.save_state(folder)
    saved = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.fill_(7.0)
    return accelerator, model, saved


def _rewrite_after(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, path: str) -> None:
    """Wrap ``owner.name`` so that ``path``'s last MiB (or half, if smaller) is rewritten right after it."""
    real: Callable[..., object] = getattr(owner, name)

    def wrapped(*args: object, **kwargs: object) -> object:
        out = real(*args, **kwargs)
        size = os.path.getsize(path)
        with open(path, "r+b") as handle:
            handle.seek(size - min(2**20, size // 2))
            handle.write(b"\x00\x00\x80\x3f" * (min(2**20, size // 2) // 4))
        return out

    monkeypatch.setattr(owner, name, wrapped)


def test_small_file_is_private_so_a_later_rewrite_cannot_reach_the_model(tmp_path, monkeypatch) -> None:
    folder = str(tmp_path / "ckpt")
    accelerator, model, saved = _saved_and_fresh(folder, side=64)
    path = os.path.join(folder, "model.safetensors")
    assert os.path.getsize(path) <= PRIVATE_READ_MAX_BYTES
    _rewrite_after(monkeypatch, CheckedFiles, "verify", path)
    accelerator.load_state(folder)
    assert torch.equal(model.weight, saved)  # the verified bytes, not the file's new ones


def test_explicit_form_refuses_a_mapped_file_rewritten_after_its_checksum(tmp_path, monkeypatch) -> None:
    folder = str(tmp_path / "ckpt")
    _, model, _ = _saved_and_fresh(folder, side=2048)
    path = os.path.join(folder, "model.safetensors")
    assert os.path.getsize(path) > PRIVATE_READ_MAX_BYTES
    _rewrite_after(monkeypatch, CheckedFiles, "verify", path)
    with pytest.raises(
        CheckpointError,
        match=r"changed on disk while it was being loaded, so nothing was applied: .*model\.safetensors. changed on disk",
    ):
        load_accelerator_state(folder, models=[model], process_index=0)
    assert bool((model.weight == 7.0).all())


def test_rewrite_racing_with_the_apply_is_reported_after_it(tmp_path, monkeypatch) -> None:
    """The limit: bytes copied while the file changes cannot be un-applied; the load says so."""
    folder = str(tmp_path / "ckpt")
    accelerator, _, _ = _saved_and_fresh(folder, side=2048)
    path = os.path.join(folder, "model.safetensors")
    real = state_io._apply_read_state

    def rewrite_then_apply(*args: object, **kwargs: object) -> None:
        with open(path, "r+b") as handle:
            handle.seek(os.path.getsize(path) - 4)
            handle.write(b"\x00\x00\x80\x3f")
        real(*args, **kwargs)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(state_io, "_apply_read_state", rewrite_then_apply)
    with pytest.raises(CheckpointError, match="changed on disk while it was being applied"):
        accelerator.load_state(folder)
