"""Per-Accelerator checkpoint state lives in the Accelerator's CheckpointMemory (issue 43, item 3).

No module of ``accelerando.checkpointing`` keeps a module-level weak dictionary keyed by owners: what a
module remembers per Accelerator is a ``MemorySlot`` of that Accelerator's memory, so it goes with it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import accelerando.checkpointing as checkpointing
from accelerando.checkpointing.target import CheckpointMemory, MemorySlot


def _module_level_weak_dicts(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Call) and "WeakKeyDictionary" in ast.unparse(value.func):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_checkpointing_has_no_module_level_owner_dictionaries() -> None:
    folder = Path(checkpointing.__file__).parent
    found = [hit for path in sorted(folder.glob("*.py")) for hit in _module_level_weak_dicts(path)]
    assert found == []


def test_a_slot_is_built_once_per_memory_and_dies_with_it() -> None:
    built: list[int] = []
    slot: MemorySlot[list[int]] = MemorySlot("probe", lambda: built.append(1) or [])
    first, second = CheckpointMemory(), CheckpointMemory()
    assert first.peek(slot) is None
    first.get(slot).append(5)
    assert first.get(slot) == [5] and second.get(slot) == [] and len(built) == 2
    second.put(slot, [7])
    assert second.peek(slot) == [7]


def test_the_resume_point_belongs_to_its_accelerator(tmp_path) -> None:
    from accelerando import Accelerator
    from accelerando.checkpointing import resume_point

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    del model
    accelerator.save_state(str(tmp_path / "ckpt"))
    other = Accelerator(cpu=True)
    assert accelerator.resume_point is None
    accelerator.load_state(str(tmp_path / "ckpt"))
    assert accelerator.resume_point is not None and resume_point(accelerator) is accelerator.resume_point
    assert other.resume_point is None
