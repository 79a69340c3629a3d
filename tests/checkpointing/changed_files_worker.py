"""Trials of issue 41 item 4, run by tests/checkpointing/test_changed_during_load.py (no tests here).

``python changed_files_worker.py <work folder> <trials json>`` saves one checkpoint (a model and an
AdamW optimizer big enough to be memory-mapped), then runs each trial in a forked child: the child
copies the checkpoint, builds the objects with other values, and loads the copy while one file is
changed at one point of the load:

- ``verify``: right after ``CheckedFiles.verify`` returned (the checksums passed);
- ``read``: right after this process read everything (``_read_candidate`` returned: every file
  deserialized and its checksum compared);
- ``apply``: at the start of ``_apply``, after every process agreed, before ``apply_state``.

Changes: ``rewrite`` (other bytes in place, same size), ``truncate`` (cut to a smaller size),
``regrow`` (cut, then zeros up to the old size). One JSON line per trial on stdout:
``{"trial": ..., "outcome": "refused" | "verified" | "unverified" | "crashed", "error": ...}``;
"refused" means an error was raised and the objects hold exactly their values from before the load.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

SIDE = 2048  # a 2048 x 2048 float32 weight: 16 MiB, so model.safetensors and optimizer.bin are mapped


def build(seed: int):
    """A fresh Accelerator with a model and an AdamW optimizer holding state (values set by ``seed``)."""
    import torch

    from accelerando import Accelerator
    from suite_support import reset_accelerator_state

    reset_accelerator_state()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(seed)
    model = torch.nn.Linear(SIDE, SIDE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.ones(1, SIDE)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return accelerator, model, optimizer


def snapshot(model, optimizer) -> list:
    """Copies of every value the load writes into: the weights and the optimizer's moments."""
    values = [t.detach().clone() for t in model.state_dict().values()]
    for state in optimizer.state_dict()["state"].values():
        values += [v.clone() for v in state.values() if hasattr(v, "clone")]
    return values


def same(a: list, b: list) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def change(path: str, how: str) -> None:
    """Change the file ``path`` in place: other bytes at its end, or cut it (then regrow it)."""
    size = os.path.getsize(path)
    if how == "rewrite":
        with open(path, "r+b") as handle:
            handle.seek(size - 2**20)
            handle.write(b"\x00\x00\x80\x3f" * (2**18))  # float32 1.0: no saved value is exactly that
    else:
        os.truncate(path, size // 3)
        if how == "regrow":
            os.truncate(path, size)


def install_hook(point: str, path: str, how: str) -> None:
    """Change ``path`` once, at ``point`` of the next load."""
    import accelerando.checkpointing.load as load
    from accelerando.checkpointing.sources import CheckedFiles

    done = []

    def once() -> None:
        if not done:
            done.append(True)
            change(path, how)

    if point == "verify":
        real_verify = CheckedFiles.verify

        def verify(self):
            out = real_verify(self)
            once()
            return out

        CheckedFiles.verify = verify
    elif point == "read":
        real_read = load._read_candidate

        def read(*args, **kwargs):
            out = real_read(*args, **kwargs)
            once()
            return out

        load._read_candidate = read
    else:
        real_apply = load._apply

        def apply(*args, **kwargs):
            once()
            return real_apply(*args, **kwargs)

        load._apply = apply


def trial(work: str, number: int, spec: dict) -> dict:
    """One load of a copy of the pristine checkpoint with one file changed at one point."""
    import torch

    folder = os.path.join(work, f"trial_{number}")
    shutil.copytree(os.path.join(work, "pristine"), folder)
    saved = torch.load(os.path.join(work, "saved.pt"))
    accelerator, model, optimizer = build(seed=1)
    before = snapshot(model, optimizer)
    install_hook(spec["point"], os.path.join(folder, spec["file"]), spec["change"])
    error = None
    try:
        accelerator.load_state(folder)
    except Exception as err:  # noqa: BLE001 - classified below
        error = f"{type(err).__name__}: {err}"
    after = snapshot(model, optimizer)
    if error is not None and same(after, before):
        outcome = "refused"
    elif error is None and same(after, saved):
        outcome = "verified"
    else:
        outcome = "unverified"
    return {"trial": spec, "outcome": outcome, "error": error}


def save(work: str, number: int, spec: dict) -> dict:
    """The pristine checkpoint and the values it holds (``saved.pt``)."""
    import torch

    accelerator, model, optimizer = build(seed=0)
    accelerator.save_state(os.path.join(work, "pristine"))
    torch.save(snapshot(model, optimizer), os.path.join(work, "saved.pt"))
    return {"trial": spec, "outcome": "saved", "error": None}


def in_child(run, work: str, number: int, spec: dict) -> None:
    """``run(work, number, spec)`` in a forked child (the parent runs no torch operation, so forking is
    safe); its JSON result, or its crash, on stdout.
    """
    pid = os.fork()
    if pid == 0:  # the child: a crash (SIGBUS) ends only it
        code = 0
        try:
            print(json.dumps(run(work, number, spec)), flush=True)
        except BaseException as err:  # noqa: BLE001 - reported, the child then ends
            print(json.dumps({"trial": spec, "outcome": "failed", "error": repr(err)}), flush=True)
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        print(
            json.dumps({"trial": spec, "outcome": "crashed", "error": f"signal {os.WTERMSIG(status)}"}),
            flush=True,
        )


def main(work: str, specs: list[dict]) -> None:
    import torch  # noqa: F401 - imported once, before the forks

    import accelerando.accelerator  # noqa: F401

    in_child(save, work, -1, {})
    for number, spec in enumerate(specs):
        in_child(trial, work, number, spec)
        shutil.rmtree(os.path.join(work, f"trial_{number}"), ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # suite_support
    main(sys.argv[1], json.loads(sys.argv[2]))
