"""Training stall per checkpoint: synchronous ``save_state()`` vs ``save_state(async_save=True)``.

A model of about 300 MB of Linear weights (fp32, SGD without state) trains on CPU. The stall of a
save is measured as the extra wall time of a training loop of ``--steps`` steps that saves once
(after its first step) over the same loop without a save: so it counts everything the save costs
the training, whether the training thread waits for it (the folder claim, the foreground copies, an
optimizer step waiting for the background copy of the parameters) or the background thread takes
CPU or memory bandwidth from it. The loop is long enough for the background commit to end inside it
(the script says so; otherwise part of the background work would not be counted).

Variants, interleaved in each repeat; reported: the median of the paired differences, the best
(shortest) loop of each variant minus the best loop without a save (the least disturbed by other
load on the machine), and the median time the training thread was blocked:
- ``sync``: ``save_state()``;
- ``async``: ``save_state(async_save=True)`` (the parameters are copied in the background while the
  next forward/backward runs; the next optimizer step waits for that copy);
- ``async, no overlap``: ``save_state(async_save=True, overlap_snapshot=False)`` (everything copied
  before ``save_state`` returns).

Also printed: how long the training thread itself was blocked (inside ``save_state`` plus an
optimizer step waiting for the background copy), which is less sensitive to other load on the
machine than the loop difference.

Run: ``python benchmarks/bench_async_checkpoint.py [--mb 300] [--steps 10] [--batch 4] [--repeats 5]
[--threads N]``.

Measured (2026-12-01, 2 shared CPU cores, load 2-4 from other jobs, torch 2.13 CPU; default flags,
``--repeats 7``): a 10-step loop without a save takes 2.55 s; the synchronous save adds 805 ms
(median of pairs; it blocks the training thread 754 ms). ``async_save=True`` blocks the training
thread 8 ms (1.1% of the synchronous save) and adds 366 ms to the loop (median of pairs, 45%; the
four undisturbed pairs: 333, 238, 366, -93 ms against 925, 805, 669, 459 ms) or 43 ms best loop
minus best loop (7.2%). What remains is the background copy and write competing with a CPU-bound,
memory-bandwidth-bound training for the same two cores and memory; the training thread itself
no longer waits. Without overlap (``overlap_snapshot=False``) the training thread is blocked 83 ms
(11%). With ``--threads 1`` (the training leaves a core to the background, as a GPU training leaves
the host CPU mostly idle; loop 4.02 s): synchronous +747 ms (blocked 869 ms), asynchronous +26 ms
median of pairs (3.5%; blocked 6 ms, 0.7%), without overlap +68 ms (9.1%; blocked 123 ms).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch


class _Blocked:
    """Seconds the training thread spent inside ``save_state`` and waiting in an optimizer step."""

    def __init__(self, optimizer: Any) -> None:
        self.seconds = 0.0
        self._optimizer = optimizer

    def save(self, save: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        handle = save()
        self.seconds += time.perf_counter() - start
        wait = getattr(self._optimizer, "_snapshot_wait", None)
        if wait is not None:  # time the step's wait for the background copy

            def timed() -> None:
                begin = time.perf_counter()
                wait()
                self.seconds += time.perf_counter() - begin

            self._optimizer._snapshot_wait = timed
        return handle


def _loop(model: Any, optimizer: Any, accelerator: Any, batch: torch.Tensor, steps: int, save: Any) -> tuple:
    """Train ``steps`` steps, saving after the first; return (seconds, seconds blocked, commit done in loop)."""
    handle, blocked = None, _Blocked(optimizer)
    start = time.perf_counter()
    for step in range(steps):
        loss = model(batch).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == 0 and save is not None:
            handle = blocked.save(save)
    elapsed = time.perf_counter() - start
    done = not hasattr(handle, "done") or handle.done()
    if hasattr(handle, "result"):
        handle.result()
    return elapsed, blocked.seconds, done


def main() -> None:
    """Print each variant's stall, the synchronous save's, and their ratio."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=300, help="model size in MB")
    parser.add_argument("--steps", type=int, default=10, help="training steps per measured loop")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads for the training (0: torch's default)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from accelerando import Accelerator
    from accelerando.utils import ProjectConfiguration

    width = 2048
    layers = max(1, args.mb * 2**20 // (width * width * 4))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    batch = torch.randn(args.batch, width)
    with tempfile.TemporaryDirectory() as folder:
        config = ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True, total_limit=2)
        accelerator = Accelerator(project_config=config)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
        model, optimizer = accelerator.prepare(model, optimizer)
        variants: dict[str, Callable[[], Any] | None] = {
            "no save": None,
            "sync": accelerator.save_state,
            "async": lambda: accelerator.save_state(async_save=True),
            "async, no overlap": lambda: accelerator.save_state(async_save=True, overlap_snapshot=False),
        }
        for save in variants.values():  # warm-up: allocator, host buffers, files
            _loop(model, optimizer, accelerator, batch, 2, save)
        loops: dict[str, list[float]] = {name: [] for name in variants}
        extra: dict[str, list[float]] = {name: [] for name in variants}
        blocked: dict[str, list[float]] = {name: [] for name in variants}
        late: dict[str, int] = dict.fromkeys(variants, 0)
        bases = []
        for _ in range(args.repeats):
            base = None
            for name, save in variants.items():
                elapsed, held, done = _loop(model, optimizer, accelerator, batch, args.steps, save)
                if base is None:
                    base = elapsed
                    bases.append(base)
                loops[name].append(elapsed)
                extra[name].append(elapsed - base)  # paired with this repeat's loop without a save
                blocked[name].append(held)
                late[name] += not done
    print(
        f"model: {size / 2**20:.0f} MiB of Linear weights ({layers} x {width}x{width}), batch {args.batch}, "
        f"{torch.get_num_threads()} intra-op thread(s), {args.steps} steps per loop, {args.repeats} repeats"
    )
    print(
        f"loop without a save: {statistics.median(bases):.2f} s (median; each: {[round(b, 2) for b in bases]})"
    )
    sync = statistics.median(extra["sync"])
    sync_best = min(loops["sync"]) - min(bases)
    sync_blocked = statistics.median(blocked["sync"])
    for name in list(variants)[1:]:
        stall, best = statistics.median(extra[name]), min(loops[name]) - min(bases)
        held = statistics.median(blocked[name])
        note = f"; commit still running at the loop's end in {late[name]} loop(s)" if late[name] else ""
        print(
            f"{name:>18}: extra loop time {stall * 1000:6.0f} ms median of pairs ({stall / sync:.1%} of sync), "
            f"{best * 1000:6.0f} ms best loop minus best loop ({best / sync_best:.1%} of sync); training "
            f"thread blocked {held * 1000:.0f} ms ({held / sync_blocked:.1%} of sync){note}"
        )
        print(f"{'':>20}pairs (ms): {[round(x * 1000) for x in extra[name]]}")


if __name__ == "__main__":
    main()
