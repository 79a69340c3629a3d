"""Per-step fault tolerance with torchft, end to end: kill a replica group, the other trains on, it recovers.

Two replica groups of one CPU process each (gloo), coordinated by the lighthouse that
``accelerando launch --fault_tolerance`` starts on loopback. Group 1 is killed (SIGKILL) at a random
step; the launcher restarts it; it recovers weights and optimizer state from group 0 (no checkpoint
exists to read) and from then on both groups hold bitwise equal weights at every common step.

The second test does the same with HSDP: groups of two processes that shard the model with FSDP2
inside the group (gloo on CPU), torchft averaging each shard across groups.

Run: ``python -m pytest -q -m slow tests/engines/test_torchft_recovery.py --timeout 900 -s``
(needs the ``torchft`` extra; a few minutes on a busy 2-core machine).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchft")

from torchft_support import measure, read_log, run_and_kill, steps_of  # noqa: E402

pytestmark = pytest.mark.slow


def test_killed_group_recovers_from_live_peer_while_the_other_trains_on(tmp_path: Path) -> None:
    seed = int(os.environ.get("ACCELERANDO_TEST_SEED", random.randrange(1 << 30)))
    kill_step = random.Random(seed).randint(3, 15)
    run = run_and_kill(tmp_path, kill_step)
    where = f"(seed {seed}, killed after step {run.kill_step}; {run})"
    print(f"torchft: {where}")

    # The healthy group kept committing steps while group 1 was down (counted, not timed).
    assert run.survivor_steps_while_down > 0, where
    # The restarted group came back at the live group's step, not at 0: it recovered from the peer...
    assert run.back_step > run.kill_step, where
    # ...and from its first step back its weights equal group 0's, bit for bit, at every common step.
    assert run.common_steps >= 10, where
    assert run.unequal_steps == [], where
    # Both groups stopped at the same step with the same weights.
    finals = [torch.load(tmp_path / f"final{i}.pt") for i in (0, 1)]
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0]), where
    last = [steps_of(read_log(tmp_path, i))[-1]["step"] for i in (0, 1)]
    assert last[0] == last[1], where
    # Nothing but the logs and final weights was written: there was no checkpoint to read.
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["final0.pt", "final1.pt", "group0.jsonl", "group1.jsonl", "launch.log", "stop_at"], (
        written
    )
    # The restarted process started with other weights (its seed differs): equality came from recovery.
    starts = [r for r in read_log(tmp_path, 1) if r["event"] == "start"]
    assert [s["attempt"] for s in starts] == [0, 1]


def test_hsdp_group_recovers_each_shard_from_its_peer(tmp_path: Path) -> None:
    seed = int(os.environ.get("ACCELERANDO_TEST_SEED", random.randrange(1 << 30)))
    kill_step = random.Random(seed).randint(3, 10)
    run = run_and_kill(tmp_path, kill_step, processes=2)
    other_rank = measure(tmp_path, run.kill_step, run.kill_time, rank=1)
    where = f"(seed {seed}, killed group 1's rank 0 after step {run.kill_step}; {run}; rank 1: {other_rank})"
    print(f"torchft HSDP: {where}")

    assert run.survivor_steps_while_down > 0, where
    assert run.back_step > run.kill_step, where
    for rank_run in (run, other_rank):  # each rank's shard equals its peer's in the live group, bitwise
        assert rank_run.common_steps >= 10 and rank_run.unequal_steps == [], where
    for suffix in ("", ".rank1"):
        ours, theirs = (torch.load(tmp_path / f"final{g}{suffix}.pt") for g in (0, 1))
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), where
    shards = [torch.load(tmp_path / f"final0{suffix}.pt")["0.weight"] for suffix in ("", ".rank1")]
    assert shards[0].shape[0] + shards[1].shape[0] == 32 and not torch.equal(shards[0], shards[1])
