"""The global data position (issue 44 item 1): a loader resumed on another number of processes
continues the same global sample order.

In-process checks drive real prepared loaders of N and M simulated processes (``num_processes`` /
``process_index`` given) in lockstep; the distributed ones save with ``Accelerator.save_state`` on real
gloo processes mid-epoch and resume with ``load_state`` on another number of them. Every check compares
the samples all ranks see for the rest of the epoch, in global order (step by step, rank by rank), with
what the uninterrupted run saw after the save point, and counts samples skipped and repeated.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from accelerando.data_loader import prepare_data_loader, skip_first_batches
from accelerando.data_loader.global_position import Layout, plan_resume
from accelerando.test_utils import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


class Ids(Dataset):
    """Sample ``i`` is the integer ``i``: batches are the ids they hold."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


class Stream(IterableDataset):
    """A stream of ``0 .. length-1`` (a defined order, the same every epoch)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return iter(range(self.length))


# ----------------------------------------------------------------------------------- the comparison
def compare(after: list[int], resumed: list[int], real: int, global_batch: int) -> dict[str, int]:
    """Skipped and repeated samples of ``resumed`` against the uninterrupted run's ``after``.

    Args:
        after: What the uninterrupted run gave out after the save point (global order, padding included).
        resumed: What the resumed run gave out for the rest of the epoch (global order).
        real: How many of ``after`` are real samples (the rest is padding of its last global batch).
        global_batch: The resumed run's global batch (its padding is shorter than one).
    """
    want, got = after[:real], resumed[:real]
    padding = resumed[real:]
    missing = [s for s in want if s not in got]
    repeated = len(got) - len(set(got)) + sum(1 for s in got if s not in want)
    return {
        "skipped": len(missing),
        "repeated": repeated,
        "out_of_order": int(got != want),
        "padding_too_long": int(len(padding) >= max(global_batch, 1)),
    }


def real_after(length: int, global_batch: int, drop_last: bool, consumed: int) -> int:
    end = length - length % global_batch if drop_last else length
    return max(end - consumed, 0)


# ------------------------------------------------------------------------------ in-process lockstep
def _case(**changes: object) -> dict:
    """A loader case: 23 ids in batches of 3, sequential, even_batches, no drop_last/split, map-style."""
    case = {
        "length": 23,
        "batch": 3,
        "shuffle": False,
        "seedable": False,
        "even": True,
        "drop_last": False,
        "split": False,
        "iterable": False,
    }
    case.update(changes)
    return case


def _make(processes: int, rank: int, case: dict, stateful: bool = False):
    torch.manual_seed(0)
    data = Stream(case["length"]) if case["iterable"] else Ids(case["length"])
    base = DataLoader(
        data,
        batch_size=case["batch"],
        shuffle=None if case["iterable"] else case["shuffle"],
        drop_last=case["drop_last"],
    )
    return prepare_data_loader(
        base,
        num_processes=processes,
        process_index=rank,
        split_batches=case["split"],
        even_batches=case["even"],
        use_seedable_sampler=case["seedable"],
        data_seed=7,
        use_stateful_dataloader=stateful,
    )


def _lockstep(loaders, steps: int | None = None) -> list[int]:
    iterators = [iter(loader) for loader in loaders]
    out, done = [], 0
    while steps is None or done < steps:
        batches = [next(it, None) for it in iterators]
        if all(b is None for b in batches):
            break
        for batch in batches:
            if batch is not None:
                out.extend(batch.tolist())
        done += 1
    if steps is not None:
        return out
    return out


def _in_process(saved: int, resumed: int, case: dict, steps: int, stateful: bool = False):
    """(counts, note, plan batches): save after ``steps`` steps on ``saved`` processes, resume on ``resumed``."""
    whole = _lockstep([_make(saved, r, case) for r in range(saved)])
    first = [_make(saved, r, case) for r in range(saved)]
    iterators = [iter(loader) for loader in first]
    for _ in range(steps):
        for it in iterators:
            next(it)
    state = first[0].state_dict()
    for it in iterators:
        it.close()
    consumed = int(state["global"]["consumed"])
    new = [_make(resumed, r, case, stateful) for r in range(resumed)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for loader in new:
            loader.load_state_dict(state)
    position = new[0].resume_position()
    skip = 0 if position is None else position[1]
    active = new if stateful else [skip_first_batches(loader, skip) for loader in new]
    rest = _lockstep(active)
    layout = Layout.from_dict(state["global"]["layout"])
    real = real_after(case["length"], layout.global_batch, case["drop_last"], consumed)
    resumed_global = Layout.from_dict(new[0].state_dict()["global"]["layout"]).global_batch
    counts = compare(whole[consumed:], rest, real, resumed_global)
    notes = [str(w.message) for w in caught if "cannot continue" in str(w.message)]
    return counts, new[0].resume_note, notes


EXACT = {"skipped": 0, "repeated": 0, "out_of_order": 0, "padding_too_long": 0}


@st.composite
def _cases(draw):
    saved, resumed = draw(st.sampled_from([(2, 1), (1, 2), (2, 3), (3, 2), (4, 2), (1, 3)]))
    split = draw(st.booleans())
    batch = draw(st.sampled_from([12, 24])) if split else draw(st.integers(1, 4))
    iterable = draw(st.booleans())
    case = {
        "length": draw(st.integers(8, 50)),
        "batch": batch,
        "shuffle": draw(st.booleans()),
        "seedable": draw(st.booleans()),
        "even": draw(st.booleans()),
        "drop_last": draw(st.booleans()),
        "split": split,
        "iterable": iterable,
    }
    global_batch = batch if split else batch * saved
    steps_in_epoch = (
        case["length"] // global_batch if case["drop_last"] else -(-case["length"] // global_batch)
    )
    if steps_in_epoch < 2:
        case["length"] = global_batch * 3
        steps_in_epoch = 3
    steps = draw(st.integers(1, steps_in_epoch - 1))
    return saved, resumed, case, steps


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_resumed_epoch_gives_the_remaining_samples_once_in_order(drawn) -> None:
    """Real prepared loaders, N -> M simulated processes, every flag: the rest of the epoch is exact."""
    saved, resumed, case, steps = drawn
    counts, note, notes = _in_process(saved, resumed, case, steps)
    if note is None:
        assert counts == EXACT, (drawn, counts)
        assert not notes
    else:  # only one process reading a stream with drop_last cannot keep the tail (DataLoader drops it)
        assert case["iterable"] and case["drop_last"] and "drop_last" in note, (drawn, note)
        assert len(notes) == 1


@settings(max_examples=300, deadline=None)
@given(
    saved=st.integers(1, 8),
    resumed=st.integers(1, 8),
    batch=st.integers(1, 6),
    length=st.integers(1, 200),
    drop_last=st.booleans(),
    even=st.booleans(),
    data=st.data(),
)
def test_plan_keeps_the_rest_of_the_global_order(
    saved, resumed, batch, length, drop_last, even, data
) -> None:
    """The pure plan: the units the resumed epoch gives out as real data are order[consumed:end]."""
    old = Layout(saved, batch * saved, length=length, drop_last=drop_last, even_batches=even)
    new = Layout(resumed, batch * resumed, length=length, drop_last=drop_last, even_batches=even)
    end = old.end or 0
    consumed = data.draw(st.integers(0, max(end, 0)))
    plan = plan_resume(old, consumed, 3, new)
    assert plan.note is None
    order = list(range(length))
    if consumed >= end:
        assert (plan.epoch, plan.batches, plan.window) == (4, 0, None)
        return
    if plan.window is None:
        # A plain position: the new layout's own epoch from batch ``batches`` (its own end).
        assert plan.batches * new.global_batch == consumed and new.end == old.end
        given_out = order[plan.batches * new.global_batch : new.end]
    else:
        window = plan.window
        given_out = order[window.offset : length if window.end is None else window.end]
        assert window.pad == (even or drop_last) and plan.batches == consumed // new.global_batch
    assert given_out == order[consumed:end]


def test_one_process_stream_with_drop_last_warns_in_one_line() -> None:
    """The non-exact case says so in one line: a stream resumed by one process with another batch size
    and ``drop_last`` loses the incomplete tail (the DataLoader drops it)."""
    case = _case(length=22, batch=2, drop_last=True, iterable=True)
    first = [_make(2, r, case) for r in range(2)]
    iterators = [iter(loader) for loader in first]
    for it in iterators:
        next(it)
    state = first[0].state_dict()
    for it in iterators:
        it.close()
    resumed = _make(1, 0, {**case, "batch": 3})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.load_state_dict(state)
    lines = [str(w.message) for w in caught]
    assert len(lines) == 1 and "\n" not in lines[0] and "drop_last" in lines[0], lines
    position = resumed.resume_position()
    assert position is not None
    rest = [i for batch in skip_first_batches(resumed, position[1]) for i in batch.tolist()]
    assert rest == list(range(4, 19))  # 19 of the saved run's 20 is the dropped tail


class Uneven:
    """A user's batch sampler of batches of 1, 2, 3, 1, 2, 3... ids (no ``batch_size``): re-sharded in
    whole batches of its own."""

    def __init__(self, length: int) -> None:
        self.batches, start = [], 0
        for size in [1, 2, 3] * length:
            if start >= length:
                break
            self.batches.append(list(range(start, min(start + size, length))))
            start += size

    def __iter__(self):
        return iter([list(batch) for batch in self.batches])

    def __len__(self) -> int:
        return len(self.batches)


@pytest.mark.parametrize(("saved", "resumed", "steps"), [(2, 3, 1), (3, 2, 1), (2, 1, 2), (1, 2, 3)])
def test_user_batch_sampler_continues_in_whole_batches(saved, resumed, steps) -> None:
    def make(processes: int, rank: int):
        loader = DataLoader(Ids(40), batch_sampler=Uneven(40))
        return prepare_data_loader(loader, num_processes=processes, process_index=rank)

    batches = Uneven(40).batches
    first = [make(saved, r) for r in range(saved)]
    iterators = [iter(loader) for loader in first]
    for _ in range(steps):
        for it in iterators:
            next(it)
    state = first[0].state_dict()
    assert state["global"]["consumed"] == steps * saved and state["global"]["layout"]["unit"] == "batches"
    new = [make(resumed, r) for r in range(resumed)]
    for loader in new:
        loader.load_state_dict(state)
    assert new[0].resume_note is None
    skip = new[0].resume_position()[1]
    rest = _lockstep([skip_first_batches(loader, skip) for loader in new])
    want = [i for batch in batches[steps * saved :] for i in batch]
    assert rest[: len(want)] == want  # then at most one round of padding batches


def test_changed_dataset_length_warns() -> None:
    first = _make(
        2,
        0,
        _case(length=20, batch=2, shuffle=True),
    )
    it = iter(first)
    next(it)
    state = first.state_dict()
    it.close()
    other = _make(
        1,
        0,
        _case(length=30, batch=2, shuffle=True),
    )
    with pytest.warns(UserWarning, match="the dataset has 30 samples, the saved run saw 20"):
        other.load_state_dict(state)


def test_stream_split_by_workers_warns() -> None:
    """A stream read by loader workers on one process has no order known to continue on two."""
    torch.manual_seed(0)
    loader = prepare_data_loader(
        DataLoader(Stream(24), batch_size=2, num_workers=2), num_processes=1, process_index=0
    )
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    other = _make(
        2,
        0,
        _case(length=24, batch=2, iterable=True),
    )
    with pytest.warns(UserWarning, match="split between loader workers") as caught:
        other.load_state_dict(state)
    assert len(caught) == 1


def test_same_layout_state_is_the_per_process_path() -> None:
    """On the same layout nothing is planned: ``position`` restores as before (skip_first_batches)."""
    case = _case(shuffle=True)
    first = _make(2, 1, case)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    it.close()
    again = _make(2, 1, case)
    again.load_state_dict(state)
    assert again.resume_position() is None and state["position"] == 2
    assert state["global"] == {"consumed": 12, "offset": 0, "layout": state["global"]["layout"]}


def test_version_one_state_still_loads() -> None:
    case = _case()
    loader = _make(1, 0, case)
    loader.load_state_dict({"version": 1, "epoch": 2, "position": 3})
    assert loader.iteration == 2 and loader.resume_position() is None
    # Read on another number of processes, the saved one is given by load_state.
    loader.load_state_dict({"version": 1, "epoch": 0, "position": 2, "saved_num_processes": 2})
    assert loader.resume_position() == (0, 4)
    assert [b.tolist() for b in skip_first_batches(loader, 4)][0] == [12, 13, 14]


# ------------------------------------------------------------------------------ real processes
# (name, loader kwargs, Accelerator dataloader-config kwargs) packed into one Accelerator per config.
CONFIGS: dict[str, dict] = {
    "default": {
        "accelerator": {},
        "loaders": [
            {"length": 37, "batch": 3, "shuffle": True},  # shuffled (a generator / a drawn seed)
            {"length": 37, "batch": 3, "shuffle": False},  # sequential
            {"length": 40, "batch": 3, "shuffle": True, "drop_last": True},  # another end on 1 and 2
            {"length": 37, "batch": 3, "iterable": True},  # IterableDatasetShard
        ],
    },
    "uneven": {
        "accelerator": {"even_batches": False},
        "loaders": [{"length": 37, "batch": 3, "shuffle": True}],
    },
    "split": {
        "accelerator": {"split_batches": True},
        "loaders": [{"length": 37, "batch": 6, "shuffle": True}],
    },
    "seedable": {
        "accelerator": {"use_seedable_sampler": True, "data_seed": 11},
        "loaders": [{"length": 37, "batch": 3, "shuffle": True}],
    },
    "dispatch": {
        "accelerator": {"dispatch_batches": True},
        "loaders": [
            {"length": 37, "batch": 3, "shuffle": True},
            {"length": 37, "batch": 3, "iterable": True},
        ],
    },
    "stateful": {
        "accelerator": {"use_stateful_dataloader": True},
        "loaders": [{"length": 37, "batch": 3, "shuffle": True}],
    },
    "auto_resume": {"accelerator": {}, "loaders": [{"length": 37, "batch": 3, "shuffle": True}]},
    # Not exact across sizes: the script's own DistributedSampler (kept as the only sharding).
    "kept_sampler": {"accelerator": {}, "loaders": [{"length": 37, "batch": 3, "distributed_sampler": True}]},
}


def _build(name: str, project: str, resuming: bool):
    from accelerando import Accelerator
    from accelerando.utils import DataLoaderConfiguration, ProjectConfiguration
    from suite_support import reset_accelerator_state

    reset_accelerator_state(partial=False)
    torch.manual_seed(0)
    config = CONFIGS[name]
    options = dict(config["accelerator"])
    kwargs = {"dataloader_config": DataLoaderConfiguration(**options)}
    if name == "auto_resume":
        kwargs["project_config"] = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    if name == "auto_resume" and resuming:
        os.environ["ACCELERANDO_AUTO_RESUME"] = "1"  # the setting's environment form (launch --auto_resume)
    try:
        accelerator = Accelerator(**kwargs)
    finally:
        os.environ.pop("ACCELERANDO_AUTO_RESUME", None)
    loaders = []
    for spec in config["loaders"]:
        data = Stream(spec["length"]) if spec.get("iterable") else Ids(spec["length"])
        shuffle = None if spec.get("iterable") else spec.get("shuffle", False)
        sampler = None
        if spec.get("distributed_sampler"):
            state = accelerator.state
            sampler = DistributedSampler(data, state.num_processes, state.process_index, shuffle=False)
            shuffle = None
        loaders.append(
            DataLoader(
                data,
                batch_size=spec["batch"],
                shuffle=shuffle,
                sampler=sampler,
                drop_last=spec.get("drop_last", False),
            )
        )
    prepared = accelerator.prepare(*loaders)
    prepared = list(prepared) if isinstance(prepared, (list, tuple)) else [prepared]
    return accelerator, prepared


def _drain(iterators) -> list[list[list[int]]]:
    """Per loader: the ids this rank got at each remaining step of the epoch."""
    out = []
    for it in iterators:
        out.append([batch.tolist() for batch in it])
    return out


def save_and_finish(names: list[str], root: str, save_after: int) -> dict:
    """Saving run: ``save_after`` steps, save_state, then the rest of the epoch (what must come again)."""
    from accelerando.state import PartialState

    report = {}
    for name in names:
        project = os.path.join(root, name)
        accelerator, loaders = _build(name, project, resuming=False)
        iterators = [iter(loader) for loader in loaders]
        head = [[next(it).tolist() for _ in range(save_after)] for it in iterators]
        if name == "auto_resume":
            accelerator.save_state()
        else:
            accelerator.save_state(os.path.join(project, "ckpt"))
        report[name] = {"head": head, "after": _drain(iterators)}
    report["rank"] = PartialState().process_index
    return report


def resume(names: list[str], root: str) -> dict:
    """Resumed run: load_state (or auto_resume), the documented skip pattern, the rest of the epoch."""
    from accelerando.checkpointing import resume_point
    from accelerando.state import PartialState

    report = {}
    for name in names:
        project = os.path.join(root, name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            accelerator, loaders = _build(name, project, resuming=True)
            if name != "auto_resume":
                accelerator.load_state(os.path.join(project, "ckpt"))
        point = resume_point(accelerator)
        active = []
        for loader, (_, skip) in zip(loaders, point.dataloaders, strict=True):
            if name in ("stateful", "auto_resume"):
                active.append(loader)  # resumes by itself
            else:
                active.append(accelerator.skip_first_batches(loader, skip) if skip else loader)
        rest = _drain([iter(loader) for loader in active])
        report[name] = {
            "rest": rest,
            "notes": [str(w.message) for w in caught if "cannot continue" in str(w.message)],
            "skip": point.batches_to_skip,
        }
    report["rank"] = PartialState().process_index
    return report


def _global(per_rank: list[list[list[int]]]) -> list[int]:
    """Step by step, rank by rank: the order in which the processes together used the samples."""
    out: list[int] = []
    for step in range(max(len(steps) for steps in per_rank)):
        for steps in per_rank:
            if step < len(steps):
                out.extend(steps[step])
    return out


def _figures(saved, resumed, names, saved_world, resumed_world) -> dict[str, list[dict[str, int]]]:
    figures = {}
    for name in names:
        rows = []
        for index, spec in enumerate(CONFIGS[name]["loaders"]):
            options = CONFIGS[name]["accelerator"]
            head = _global([r[name]["head"][index] for r in saved])
            after = _global([r[name]["after"][index] for r in saved])
            rest = _global([r[name]["rest"][index] for r in resumed])
            split = options.get("split_batches", False)
            old_global = spec["batch"] if split else spec["batch"] * saved_world
            new_global = spec["batch"] if split else spec["batch"] * resumed_world
            real = real_after(spec["length"], old_global, spec.get("drop_last", False), len(head))
            counts = compare(after, rest, real, new_global)
            counts["already_used_again"] = sum(1 for s in rest[:real] if s in head)
            rows.append(counts)
        figures[name] = rows
    return figures


# Every configuration, one Accelerator each, in one launch per run.
NAMES = ["default", "uneven", "split", "seedable", "dispatch", "stateful", "auto_resume"]


def _assert_exact(figures: dict, resumed: list[dict], names: list[str], label: str) -> None:
    for name in names:
        for index, counts in enumerate(figures[name]):
            print(f"{label} {name} loader {index}: {counts}")
            assert counts == {**EXACT, "already_used_again": 0}, (name, index, counts)
        for report in resumed:
            assert report[name]["notes"] == [], (name, report[name]["notes"])


def _check(tmp_path, saved_world: int, resumed_worlds: list[int], save_after: int) -> None:
    root = str(tmp_path)
    names = [*NAMES, "kept_sampler"]
    saved = run_distributed(save_and_finish, saved_world, names, root, save_after)
    for world in resumed_worlds:
        resumed = run_distributed(resume, world, names, root)
        figures = _figures(saved, resumed, NAMES, saved_world, world)
        _assert_exact(figures, resumed, NAMES, f"{saved_world}->{world}")
        notes = [report["kept_sampler"]["notes"] for report in resumed]
        if world == saved_world:
            assert notes == [[]] * world
            continue
        for lines in notes:  # one line per process, naming the loader and what differs
            assert len(lines) == 1 and "\n" not in lines[0], lines
            assert "dataloader 0 cannot continue" in lines[0] and "DistributedSampler" in lines[0]
            print(f"{saved_world}->{world} kept_sampler: {lines[0]}")


def test_two_processes_resumed_on_one_and_on_two(tmp_path) -> None:
    """Saved on 2 gloo processes mid-epoch; resumed on 1 (a new global batch) and on 2 (the same
    layout: the per-process path): 0 samples skipped or repeated, for every configuration."""
    _check(tmp_path, 2, [1, 2], save_after=3)


def test_one_process_resumed_on_two(tmp_path) -> None:
    """Saved on 1 process after 3 batches: 9 samples, not a whole global batch of 2 processes (6), so
    the resumed epoch starts at sample 9 of the same order (a window): 0 skipped or repeated."""
    _check(tmp_path, 1, [2], save_after=3)


@pytest.mark.slow
@pytest.mark.parametrize(("saved_world", "resumed_world", "save_after"), [(2, 3, 2), (3, 2, 3)])
def test_three_processes(tmp_path, saved_world, resumed_world, save_after) -> None:
    """2 -> 3 and 3 -> 2: positions that are not whole global batches of the new layout."""
    _check(tmp_path, saved_world, [resumed_world], save_after)
