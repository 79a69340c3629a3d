"""Hostile and faulty checkpoint folders, table-driven: each case is (how the folder is made hostile or
damaged, which entry point loads it) -> the exception and a fragment of its message. Every case also
checks that no code from the folder ran (a canary file the malicious pickles would create) and that
nothing outside the folder was opened or ``stat``-ed (every path given to ``os.stat``, ``os.lstat``,
``os.open``, ``os.scandir``, ``os.listdir`` and ``open`` during the load is recorded).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import pickle
import shlex
import shutil
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import (
    CheckpointError,
    load_accelerator_state,
    load_custom_state,
    verify_checkpoint,
)
from accelerando.checkpointing import files as F
from accelerando.checkpointing import manifest as manifest_module
from accelerando.checkpointing.digest import file_digest
from accelerando.checkpointing.files import UnsafeCheckpointError
from accelerando.checkpointing.manifest import MANIFEST_NAME
from accelerando.plugins.project import ProjectConfiguration
from suite_support import reset_accelerator_state

pytestmark = pytest.mark.usefixtures("fresh_state")

OPT_IN = "load_kwargs={'weights_only': False}"


class Counter:
    """A registered stateful object with plain-data state."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.count = state["count"]


class Payload:
    """Unpickling this runs a shell command that creates the canary file."""

    def __init__(self, canary: str) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(self.canary)}",))


def _objects() -> tuple[Any, ...]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=2)
    return model, optimizer, scheduler, loader


def _accelerator(project: str) -> tuple[Any, ...]:
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    model, optimizer, scheduler, loader = accelerator.prepare(*_objects())
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    return accelerator, model, optimizer, scheduler, loader, counter


def _fill(model: Any, value: float) -> None:
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(value)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    """A project with checkpoint_0 (weights 0.0, counter 10) and checkpoint_1 (weights 1.0, counter 11)."""
    reset_accelerator_state()
    project = str(tmp_path_factory.mktemp("template") / "project")
    accelerator, model, optimizer, scheduler, loader, counter = _accelerator(project)
    for value in (0.0, 1.0):
        for batch in loader:
            model(batch).sum().backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            break
        _fill(model, value)
        counter.count = 10 + int(value)
        accelerator.save_state()
    reset_accelerator_state()
    return project


class Scene:
    """One test's copy of the template project, the files outside it, and the canary."""

    def __init__(self, template: str, tmp_path: Any) -> None:
        self.project = str(tmp_path / "project")
        shutil.copytree(template, self.project, symlinks=True)
        self.folder = os.path.join(self.project, "checkpoints", "checkpoint_1")
        self.canary = str(tmp_path / "canary")
        self.outside = str(tmp_path / "outside")
        os.makedirs(self.outside)
        self.secret = os.path.join(self.outside, "secret.bin")
        with open(self.secret, "wb") as handle:
            handle.write(b"s" * 100)
        self.evil = os.path.join(self.outside, "evil.bin")
        torch.save({"state": {}, "param_groups": [], "x": Payload(self.canary)}, self.evil)

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def manifest(self) -> dict[str, Any]:
        with open(self.path(MANIFEST_NAME), encoding="utf-8") as handle:
            return json.load(handle)

    def write_manifest(self, payload: Any) -> None:
        with open(self.path(MANIFEST_NAME), "w", encoding="utf-8") as handle:
            json.dump(payload, handle)

    def resign(self) -> None:
        """What an attacker does after editing files: recompute every entry (a checksum is no signature)."""
        payload = self.manifest()
        files = {}
        for root, _, names in os.walk(self.folder):
            for name in names:
                rel = os.path.relpath(os.path.join(root, name), self.folder)
                if rel != MANIFEST_NAME:
                    entry = file_digest(os.path.join(root, name))  # follows a link, as an attacker would
                    files[rel] = {
                        "size": entry.size,
                        "checksum": entry.checksum,
                        "algorithm": entry.algorithm,
                    }
        payload["files"] = files
        self.write_manifest(payload)

    def flip_weights(self) -> None:
        path = self.path("model.safetensors")
        with open(path, "r+b") as handle:
            handle.seek(-1, os.SEEK_END)
            last = handle.read(1)
            handle.seek(-1, os.SEEK_END)
            handle.write(bytes([last[0] ^ 0x40]))


@pytest.fixture
def scene(template, tmp_path) -> Scene:
    return Scene(template, tmp_path)


@contextlib.contextmanager
def recording(monkeypatch) -> Iterator[list[str]]:
    """Record every path the code opens, stats, lists or scans while the block runs."""
    seen: list[str] = []

    def spy(real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if args and isinstance(args[0], (str, bytes, os.PathLike)):
                seen.append(os.path.normpath(os.path.abspath(os.fsdecode(args[0]))))
            return real(*args, **kwargs)

        return wrapper

    with monkeypatch.context() as patch:
        for name in ("stat", "lstat", "open", "scandir", "listdir", "readlink"):
            patch.setattr(os, name, spy(getattr(os, name)))
        patch.setattr(builtins, "open", spy(builtins.open))
        yield seen


def _assert_untouched(scene: Scene, seen: list[str]) -> None:
    assert not os.path.exists(scene.canary), "code from the checkpoint ran"
    outside = [
        p for p in seen if p == scene.outside or p.startswith(scene.outside + os.sep) or p == "/etc/passwd"
    ]
    assert not outside, f"touched outside the checkpoint: {outside}"


# ---------------------------------------------------------------- entry points


def _load_auto(scene: Scene) -> Any:
    accelerator, *rest = _accelerator(scene.project)
    accelerator.load_state()
    return rest


def _load_explicit(scene: Scene) -> Any:
    accelerator, *rest = _accelerator(scene.project)
    accelerator.load_state(scene.folder)
    return rest


def _load_unverified(scene: Scene) -> Any:
    os.remove(scene.path(MANIFEST_NAME))
    accelerator, *rest = _accelerator(scene.project)
    accelerator.load_state(scene.folder, allow_unverified=True)
    return rest


def _load_objects(scene: Scene) -> Any:
    _, model, optimizer, scheduler, loader, counter = _accelerator(scene.project)
    load_accelerator_state(
        scene.folder,
        models=[model],
        optimizers=[optimizer],
        schedulers=[scheduler],
        dataloaders=[loader],
        process_index=0,
    )
    return model, optimizer, scheduler, loader, counter


def _load_objects_unverified(scene: Scene) -> Any:
    os.remove(scene.path(MANIFEST_NAME))
    return _load_objects(scene)


def _load_custom(scene: Scene) -> Any:
    counter = Counter()
    load_custom_state(counter, scene.folder, 0)
    return counter


ENTRY_POINTS: dict[str, Callable[[Scene], Any]] = {
    "load_state()": _load_auto,
    "load_state(dir)": _load_explicit,
    "load_state(dir, allow_unverified=True)": _load_unverified,
    "load_accelerator_state(dir, objects)": _load_objects,
    "load_accelerator_state(dir, objects), no manifest": _load_objects_unverified,
    "load_custom_state": _load_custom,
}

# ---------------------------------------------------------------- 1. no code from checkpoint files

STATE_ENTRIES = [e for e in ENTRY_POINTS if e != "load_custom_state"]
UNSAFE_CASES = [
    (name, entry)
    for name in (
        "optimizer.bin",
        "scheduler.bin",
        "random_states_0.pkl",
        "dl_state_dict.bin",
        "pytorch_model.bin",
    )
    for entry in STATE_ENTRIES
] + [
    ("custom_checkpoint_0.pkl", entry)
    for entry in (
        "load_state()",
        "load_state(dir)",
        "load_state(dir, allow_unverified=True)",
        "load_custom_state",
    )
]


@pytest.mark.parametrize(("name", "entry"), UNSAFE_CASES, ids=[f"{n}|{e}" for n, e in UNSAFE_CASES])
def test_a_malicious_pickle_never_runs(scene, monkeypatch, name: str, entry: str) -> None:
    assert os.path.exists(scene.path(name)) or name == "pytorch_model.bin"
    if name == "pytorch_model.bin":
        os.remove(scene.path("model.safetensors"))
    torch.save({"state": {}, "param_groups": [], "x": Payload(scene.canary)}, scene.path(name))
    scene.resign()  # the manifest checks out: only the weights-only reader stands in the way
    with recording(monkeypatch) as seen, pytest.raises(UnsafeCheckpointError) as caught:
        ENTRY_POINTS[entry](scene)
    message = str(caught.value)
    assert name in message and "system" in message and OPT_IN in message, message
    assert caught.value.refused.endswith("system")
    _assert_untouched(scene, seen)


def test_the_explicit_opt_in_unpickles_what_it_must(scene) -> None:
    torch.save({"count": 5, "extra": Counter()}, scene.path("custom_checkpoint_0.pkl"))  # harmless object
    scene.resign()
    with pytest.raises(UnsafeCheckpointError, match="Counter"):
        load_custom_state(Counter(), scene.folder, 0)
    counter = Counter()
    state = load_custom_state(counter, scene.folder, 0, load_kwargs={"weights_only": False})
    assert counter.count == 5 and isinstance(state["extra"], Counter)


def _record(path: str) -> dict[str, bool]:
    """A harmless stand-in for an attacker's function: it only creates the canary."""
    with open(path, "w", encoding="utf-8"):
        pass
    return {"ran": True}


class Marker:
    """Unpickling this calls :func:`_record`."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (_record, (self.path,))


class Holder:
    """A registered object whose state_dict holds an arbitrary Python object."""

    def __init__(self, payload: Any = None) -> None:
        self.payload = payload
        self.loaded: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {"payload": self.payload}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = state


def _fresh_accelerator(project: str) -> tuple[Any, Holder]:
    reset_accelerator_state()
    accelerator = _accelerator(project)[0]  # registers a Counter first: the holder is object 1
    holder = Holder()
    accelerator.register_for_checkpointing(holder)
    return accelerator, holder


def test_a_malicious_checkpoint_built_with_the_library_runs_nothing(tmp_path) -> None:
    """Anyone can make a folder whose manifest checks out: only the weights-only reader stops the code."""
    canary = tmp_path / "canary"
    project = str(tmp_path / "project")
    accelerator, holder = _fresh_accelerator(project)
    holder.payload = Payload(str(canary))
    folder = accelerator.save_state()  # saving pickles; it never unpickles
    verify_checkpoint(folder, checksums=True)
    for load in (lambda acc: acc.load_state(), lambda acc: acc.load_state(folder)):
        fresh, _ = _fresh_accelerator(project)
        with pytest.raises(UnsafeCheckpointError) as caught:
            load(fresh)
        message = str(caught.value)
        for fragment in ("custom_checkpoint_1.pkl", "system", OPT_IN, "registered object 1 (a Holder)"):
            assert fragment in message, message
    assert not canary.exists()


def test_the_callers_opt_in_loads_a_library_built_checkpoint(tmp_path) -> None:
    canary = tmp_path / "canary"
    project = str(tmp_path / "project")
    accelerator, holder = _fresh_accelerator(project)
    holder.payload = Marker(str(canary))
    folder = accelerator.save_state()
    fresh, loaded = _fresh_accelerator(project)
    with pytest.raises(UnsafeCheckpointError, match=r"custom_checkpoint_1\.pkl.*_record"):
        fresh.load_state(folder)
    assert not canary.exists() and loaded.loaded is None
    fresh.load_state(folder, load_kwargs={"weights_only": False})
    assert canary.exists(), "the opt-in should unpickle fully"
    assert loaded.loaded == {"payload": {"ran": True}}


# ---------------------------------------------------------------- 2. the manifest is the complete list


def _unlisted_weights(scene: Scene) -> None:
    payload = scene.manifest()
    del payload["files"]["model.safetensors"]
    scene.write_manifest(payload)
    scene.flip_weights()


def _no_files_listed(scene: Scene) -> None:
    payload = scene.manifest()
    payload["files"] = {}
    scene.write_manifest(payload)
    scene.flip_weights()


def _algorithm(value: str) -> Callable[[Scene], None]:
    def mutate(scene: Scene) -> None:
        payload = scene.manifest()
        for entry in payload["files"].values():
            entry["algorithm"] = value
        scene.write_manifest(payload)
        scene.flip_weights()

    return mutate


def _entry_named(name: Callable[[Scene], str]) -> Callable[[Scene], None]:
    def mutate(scene: Scene) -> None:
        payload = scene.manifest()
        payload["files"][name(scene)] = {"size": 100, "checksum": 0, "algorithm": "crc32"}  # secret's size
        scene.write_manifest(payload)

    return mutate


def _linked_optimizer(scene: Scene) -> None:
    os.remove(scene.path("optimizer.bin"))
    os.symlink(scene.evil, scene.path("optimizer.bin"))
    scene.resign()  # the entry describes the link's target: size and checksum match


def _linked_entry(scene: Scene) -> None:
    os.symlink(scene.outside, scene.path("extra"))  # not listed, never read: still refused


def _linked_manifest(scene: Scene) -> None:
    copy = os.path.join(scene.outside, MANIFEST_NAME)
    shutil.move(scene.path(MANIFEST_NAME), copy)
    os.symlink(copy, scene.path(MANIFEST_NAME))


def _text(text: bytes) -> Callable[[Scene], None]:
    def mutate(scene: Scene) -> None:
        with open(scene.path(MANIFEST_NAME), "wb") as handle:
            handle.write(text)

    return mutate


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[Scene], None]:
    def mutate(scene: Scene) -> None:
        payload = scene.manifest()
        change(payload)
        scene.write_manifest(payload)

    return mutate


def _unlisted_custom(scene: Scene) -> None:
    torch.save({"count": 99}, scene.path("custom_checkpoint_0.pkl"))
    payload = scene.manifest()
    del payload["files"]["custom_checkpoint_0.pkl"]
    scene.write_manifest(payload)


def _first_size(payload: dict[str, Any], value: Any) -> None:
    next(iter(payload["files"].values()))["size"] = value


MANIFEST_CASES: dict[str, tuple[Callable[[Scene], None], str]] = {
    "weights unlisted + flipped byte": (_unlisted_weights, "'model.safetensors' would be read but"),
    "files {} + flipped byte": (_no_files_listed, "'model.safetensors' would be read but"),
    "algorithm none + flipped byte": (_algorithm("none"), "unknown checksum algorithm 'none'"),
    "algorithm unknown + flipped byte": (_algorithm("sha999"), "unknown checksum algorithm 'sha999'"),
    "entry ../../../outside": (_entry_named(lambda s: "../../../outside/secret.bin"), "not a plain relative"),
    "entry absolute, outside": (_entry_named(lambda s: s.secret), "not a plain relative"),
    "entry /etc/passwd": (_entry_named(lambda s: "/etc/passwd"), "not a plain relative"),
    "entry with an empty part": (_entry_named(lambda s: "a//optimizer.bin"), "not a plain relative"),
    "entry ./name": (_entry_named(lambda s: "./optimizer.bin"), "not a plain relative"),
    "symlinked optimizer.bin": (_linked_optimizer, "symbolic link, 'optimizer.bin'"),
    "symlinked unlisted entry": (_linked_entry, "symbolic link, 'extra'"),
    "manifest is a JSON list": (_text(b"[]"), "expected a JSON object, found a JSON array"),
    "manifest is not JSON": (_text(b"\xff\xfe\x00binary"), "cannot be parsed"),
    "files is a list": (_edit(lambda p: p.update(files=[])), "'files' has the wrong type"),
    "size is a string": (_edit(lambda p: _first_size(p, "12")), "'size' has the wrong type"),
    "world_size missing": (_edit(lambda p: p.pop("world_size")), "'world_size' is missing"),
    "world_size 0": (_edit(lambda p: p.update(world_size=0)), "'world_size' must be at least 1"),
    "entry is a list": (_edit(lambda p: p["files"].update({"optimizer.bin": [1, 2]})), "expected an object"),
    "custom state unlisted": (_unlisted_custom, "'custom_checkpoint_0.pkl' would be read but"),
}
MANIFEST_ENTRIES = ["load_state()", "load_state(dir)", "load_accelerator_state(dir, objects)"]
MANIFEST_MATRIX = [
    (case, entry)
    for case in MANIFEST_CASES
    for entry in MANIFEST_ENTRIES + (["load_custom_state"] if case == "custom state unlisted" else [])
    if not (case == "custom state unlisted" and entry == "load_accelerator_state(dir, objects)")
]


def _assert_checkpoint_0(objects: Any) -> None:
    model, *_, counter = objects
    assert all(bool((p == 0.0).all()) for p in model.parameters()), "checkpoint_0's weights were not loaded"
    assert counter.count == 10


@pytest.mark.parametrize(("case", "entry"), MANIFEST_MATRIX, ids=[f"{c}|{e}" for c, e in MANIFEST_MATRIX])
def test_damaged_manifest_falls_back_or_is_named(scene, monkeypatch, case: str, entry: str) -> None:
    mutate, fragment = MANIFEST_CASES[case]
    mutate(scene)
    if entry == "load_state()":  # automatic: the damaged newest checkpoint is skipped with a warning
        with (
            recording(monkeypatch) as seen,
            pytest.warns(UserWarning, match="Skipping damaged checkpoint") as rec,
        ):
            objects = _load_auto(scene)
        assert any(fragment in str(w.message) for w in rec), [str(w.message) for w in rec]
        _assert_checkpoint_0(objects)
    else:
        with recording(monkeypatch) as seen, pytest.raises(CheckpointError) as caught:
            ENTRY_POINTS[entry](scene)
        assert fragment in str(caught.value) and "checkpoint_1" in str(caught.value), str(caught.value)
        assert not isinstance(caught.value, UnsafeCheckpointError)
    _assert_untouched(scene, seen)


@pytest.mark.parametrize("entry", ["load_state()", "load_state(dir)"])
def test_any_parse_failure_is_damage(scene, monkeypatch, entry: str) -> None:
    """An error nobody foresaw (here an IndexError) while parsing is damage, not a crash."""
    payload = scene.manifest()
    payload["extra"]["boom"] = 1
    scene.write_manifest(payload)
    real = manifest_module.Manifest.from_json.__func__

    def from_json(cls: Any, text: str) -> Any:
        if '"boom"' in text:
            raise IndexError("list index out of range")
        return real(cls, text)

    monkeypatch.setattr(manifest_module.Manifest, "from_json", classmethod(from_json))
    if entry == "load_state()":
        with pytest.warns(UserWarning, match="IndexError"):
            _assert_checkpoint_0(_load_auto(scene))
    else:
        with pytest.raises(CheckpointError, match="checkpoint_1.*cannot be parsed.*IndexError"):
            _load_explicit(scene)


@pytest.mark.parametrize(
    "entry",
    [
        "load_state(dir)",
        "load_state(dir, allow_unverified=True)",
        "load_accelerator_state(dir, objects)",
        "load_accelerator_state(dir, objects), no manifest",
    ],
)
def test_a_symlinked_manifest_or_file_is_refused_without_a_manifest_too(
    scene, monkeypatch, entry: str
) -> None:
    if entry.endswith("no manifest") or "unverified" in entry:
        os.remove(scene.path("scheduler.bin"))
        os.symlink(scene.evil, scene.path("scheduler.bin"))
        fragment = "symbolic link, 'scheduler.bin'"
    else:
        _linked_manifest(scene)  # automatic mode lists checkpoints outside this module: explicit only
        fragment = f"{MANIFEST_NAME} is a symbolic link"
    with recording(monkeypatch) as seen, pytest.raises(CheckpointError, match=fragment):
        ENTRY_POINTS[entry](scene)
    _assert_untouched(scene, seen)


def test_a_symlinked_custom_state_is_refused(scene, monkeypatch) -> None:
    os.remove(scene.path("custom_checkpoint_0.pkl"))
    os.symlink(scene.evil, scene.path("custom_checkpoint_0.pkl"))
    scene.resign()
    with recording(monkeypatch) as seen, pytest.raises(CheckpointError, match="symbolic link"):
        load_custom_state(Counter(), scene.folder, 0)
    _assert_untouched(scene, seen)


def test_every_checkpoint_damaged_is_one_clear_error(scene) -> None:
    for number in (0, 1):
        folder = os.path.join(scene.project, "checkpoints", f"checkpoint_{number}")
        with open(os.path.join(folder, MANIFEST_NAME), "w", encoding="utf-8") as handle:
            handle.write("[]")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointError, match="Every checkpoint"):
            _load_auto(scene)


# ---------------------------------------------------------------- the switch and its errors


def test_load_kwargs_weights_only_is_checked_and_other_keys_reach_torch_load(scene) -> None:
    accelerator, *_ = _accelerator(scene.project)
    with pytest.raises(TypeError, match="weights_only"):
        accelerator.load_state(scene.folder, load_kwargs={"weights_only": "no"})
    with pytest.raises(TypeError, match="must be a dict"):
        accelerator.load_state(scene.folder, load_kwargs=[("weights_only", False)])
    with pytest.raises(TypeError, match="not torch.load options"):
        accelerator.load_state(scene.folder, load_kwargs={"mmapp": True})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accelerator.load_state(scene.folder, load_kwargs={"mmap": True, "weights_only": True})


def test_torch_load_follows_the_callers_choice(tmp_path) -> None:
    """The FSDP optimizer loader calls files.torch_load without arguments: it follows load_state's choice."""
    path = str(tmp_path / "optimizer.bin")
    torch.save({"x": Counter()}, path)
    with pytest.raises(UnsafeCheckpointError, match="Counter"):
        F.torch_load(path, "cpu")
    with F.unpickling(False):
        assert isinstance(F.torch_load(path, "cpu")["x"], Counter)
    with pytest.raises(UnsafeCheckpointError):
        F.torch_load(path, "cpu")  # the choice ends with the block


def test_a_damaged_pickle_is_damage_not_a_refusal(tmp_path) -> None:
    path = str(tmp_path / "scheduler.bin")
    torch.save({"a": 1}, path, _use_new_zipfile_serialization=False)
    data = bytearray(open(path, "rb").read())
    data[-3] = 0xFF  # an unknown opcode near the end
    with open(path, "wb") as handle:
        handle.write(bytes(data))
    with pytest.raises(Exception) as caught:
        F.torch_load(path)
    assert not isinstance(caught.value, UnsafeCheckpointError)


def test_public_load_never_falls_back(tmp_path) -> None:
    from accelerando.common.serialization import load

    path = str(tmp_path / "x.bin")
    torch.save({"x": Payload(str(tmp_path / "canary"))}, path)
    with pytest.raises(pickle.UnpicklingError, match=r"x\.bin.*system.*weights_only=False"):
        load(path)
    assert not os.path.exists(tmp_path / "canary")
