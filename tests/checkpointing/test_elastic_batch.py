"""Resuming on another number of processes (issue 44, items 2 and 3): ``elastic_batch`` and random states.

Real processes (gloo): a run saved on N processes is resumed on M. With ``elastic_batch="keep_global"``
the batch per optimizer step, the step counter and the learning-rate pace are the saved run's, so the
losses after the resume equal the uninterrupted run's within float reassociation; the default keeps
``gradient_accumulation_steps`` and says in one line what changed. Random states: a process that existed
gets its own back, a new one a seed derived from the saved states by the documented rule.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelerando.checkpointing.elastic import manifest_facts, plan_resize
from accelerando.test_utils import run_distributed

sys.path.insert(0, os.path.dirname(__file__))
import elastic_batch_worker as worker  # noqa: E402

STEPS, SAVE_AFTER = 6, 3


def _max_relative(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    ("saved", "resumed"), [((2, 1), (1, 2)), pytest.param((1, 2), (2, 1), marks=pytest.mark.slow)]
)
def test_keep_global_continues_the_uninterrupted_run(tmp_path, saved, resumed) -> None:
    """(world, accumulation) saved -> resumed: losses, learning rates and weights follow the uninterrupted run."""
    folder = str(tmp_path / "ckpt")
    world, cycle = saved
    uninterrupted = run_distributed(worker.train, world, cycle, STEPS, folder, SAVE_AFTER, False)[0]
    new_world, script_cycle = resumed[0], 1  # the script keeps its own setting: load_state changes it
    after = run_distributed(
        worker.train,
        new_world,
        script_cycle,
        STEPS - SAVE_AFTER,
        folder,
        None,
        True,
        "keep_global",
        SAVE_AFTER,
    )
    for report in after:
        assert report["accumulation"] == resumed[1]
    head = after[0]
    difference = _max_relative(head["losses"], uninterrupted["losses"][SAVE_AFTER:])
    print(f"{saved} -> {resumed}: max relative loss difference {difference:.2e}")
    assert difference <= 1e-6
    assert _max_relative(head["lrs"], uninterrupted["lrs"][SAVE_AFTER:]) <= 1e-12
    for got, want in zip(head["weights"], uninterrupted["weights"], strict=True):
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    lines = [m for m in head["messages"] if "keep_global" in m]
    assert len(lines) == 1 and f"{cycle} -> {resumed[1]}" in lines[0]


def test_default_keeps_accumulation_and_says_what_changed(tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    run_distributed(worker.train, 2, 1, SAVE_AFTER, folder, SAVE_AFTER, False)
    (after,) = run_distributed(worker.train, 1, 1, 1, folder, None, True, None, SAVE_AFTER)
    assert after["accumulation"] == 1
    lines = [m for m in after["messages"] if "resumed on 1 process from a save on 2 processes" in m]
    assert len(lines) == 1 and "elastic_batch='keep_global'" in lines[0]


def test_random_states_follow_the_elastic_rule(tmp_path) -> None:
    """1 -> 2: rank 0 continues its own streams, rank 1 gets a derived one (the same on every resume);
    2 -> 1: rank 0 continues its own."""
    one = str(tmp_path / "one")
    (saved_alone,) = run_distributed(worker.rng_draws, 1, one, True)
    first = run_distributed(worker.rng_draws, 2, one, False)
    second = run_distributed(worker.rng_draws, 2, one, False)
    assert first[0]["torch"] == saved_alone["torch"] and first[0]["numpy"] == saved_alone["numpy"]
    assert first[0]["python"] == saved_alone["python"]
    for kind in ("torch", "python", "numpy"):
        assert first[1][kind] == second[1][kind]  # deterministic
        assert first[1][kind] != first[0][kind]  # not a copy of rank 0's stream
    two = str(tmp_path / "two")
    saved_pair = run_distributed(worker.rng_draws, 2, two, True)
    (alone,) = run_distributed(worker.rng_draws, 1, two, False)
    assert alone["torch"] == saved_pair[0]["torch"] and alone["python"] == saved_pair[0]["python"]


@given(
    saved_world=st.integers(1, 16),
    world=st.integers(1, 16),
    accumulation=st.integers(1, 8),
    optimizer_steps=st.integers(0, 1000),
    split=st.booleans(),
)
def test_keep_global_keeps_the_batch_where_it_divides(
    saved_world, world, accumulation, optimizer_steps, split
):
    extra = manifest_facts(accumulation, [saved_world])
    step = optimizer_steps * accumulation
    plan = plan_resize(extra, saved_world, world, 1, step, split, "keep_global")
    per_micro_before, per_micro_now = (1, 1) if split else (saved_world, world)
    if (accumulation * per_micro_before) % per_micro_now == 0:
        assert plan.gradient_accumulation_steps * per_micro_now == accumulation * per_micro_before
        assert plan.step == optimizer_steps * plan.gradient_accumulation_steps  # same optimizer step
        assert plan.scheduler_repeats == (saved_world,)
    else:
        assert plan.gradient_accumulation_steps == 1 and "cannot keep" in plan.message
    default = plan_resize(extra, saved_world, world, 3, step, split, "keep_accumulation")
    assert default.gradient_accumulation_steps == 3 and default.step == step
    assert bool(default.message) == (saved_world != world)


def test_the_setting_comes_from_flag_environment_config_and_code(tmp_path, isolated_env) -> None:
    from accelerando.commands.launch import launch_command_parser
    from accelerando.core.settings import Sourced, resolve, resolve_runtime_settings
    from accelerando.core.settings.configfile import load_config_layer
    from accelerando.launchers.plan import export_env

    args = launch_command_parser().parse_args(["--elastic_batch", "keep_global", "train.py"])
    assert args.elastic_batch == "keep_global"
    flag = resolve([{"elastic_batch": Sourced("keep_global", "cli:--elastic_batch")}], warn_sources=())
    seen = resolve_runtime_settings(environ=export_env(flag))
    assert (
        seen.elastic_batch == "keep_global"
        and seen.source("elastic_batch") == "env:ACCELERANDO_ELASTIC_BATCH"
    )
    config = tmp_path / "config.yaml"
    config.write_text("elastic_batch: keep_global\n")
    from_file = resolve([load_config_layer(config)])
    assert from_file.elastic_batch == "keep_global" and from_file.source("elastic_batch").startswith("config")
    assert resolve_runtime_settings(environ={}).elastic_batch == "keep_accumulation"
    with pytest.raises(ValueError, match="elastic_batch"):
        resolve([{"elastic_batch": Sourced("keep_all", "code")}])


def test_a_prepared_loader_and_keep_global_continue_the_two_process_run_on_one(tmp_path) -> None:
    """Items 1 and 2 together, with the documented resume pattern: saved mid-epoch on 2 processes
    (shuffled loader), resumed on 1 with keep_global: the same samples in the same optimizer steps
    (none skipped or repeated) and the same losses."""
    folder = str(tmp_path / "ckpt")
    steps, save_after = 10, 4
    whole = run_distributed(worker.train_from_loader, 2, 1, steps, folder, save_after, False, None)[0]
    (after,) = run_distributed(
        worker.train_from_loader, 1, 1, steps - save_after, folder, None, True, "keep_global"
    )
    assert after["accumulation"] == 2
    per_step = 2 * worker.PER_PROCESS_BATCH
    expected = whole["seen"][save_after * per_step :]
    assert sorted(after["seen"]) == sorted(expected)  # 0 skipped, 0 repeated
    for step in range(steps - save_after):  # each optimizer step took the same samples
        window = slice(step * per_step, (step + 1) * per_step)
        assert sorted(after["seen"][window]) == sorted(expected[window])
    difference = _max_relative(after["losses"], whole["losses"][save_after:])
    print(f"prepared loader 2 -> 1 keep_global: max relative loss difference {difference:.2e}")
    assert difference <= 1e-6
