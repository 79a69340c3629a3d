"""Hostile and faulty big-model input: each case -> exception type and a message naming the problem and fix.

Covers checkpoints missing keys (tensors left on ``meta``), devices this machine does not have, bad
``max_memory`` budgets, crafted safetensors headers, ``.bin`` pickles that would run code, and shard
indexes that point outside their folder (nothing outside may be opened or even stat'ed).
"""

from __future__ import annotations

import builtins
import io
import json
import logging
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from accelerando.big_modeling import (
    cpu_offload,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from accelerando.big_modeling.budgets import get_max_memory
from accelerando.big_modeling.device_map import infer_auto_device_map
from accelerando.big_modeling.loading import checkpoint_files, load_state_dict
from accelerando.big_modeling.offload import read_safetensors_header, safetensors_view
from accelerando.core.settings.fields import quote_value

MAX_MESSAGE = 1_000


class Net(nn.Module):
    def __init__(self, width: int = 4, depth: int = 2) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))
        self.register_buffer("scale", torch.ones(width))

    def forward(self, x):
        return self.layers(x) * self.scale


def _empty(**kwargs) -> Net:
    with init_empty_weights(include_buffers=True):
        return Net(**kwargs)


def _save(path: Path, drop: tuple[str, ...] = (), **kwargs) -> Path:
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in Net(**kwargs).state_dict().items() if k not in drop}
    save_file(state, str(path))
    return path


def _raw_safetensors(path: Path, header: object, data: bytes = b"", length: int | None = None) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


def _absent_device() -> int:
    return torch.cuda.device_count()  # the first index that does not exist here


def _check(error: pytest.ExceptionInfo, fragments: list[str]) -> None:
    message = str(error.value.args[0])
    assert len(message) < MAX_MESSAGE, message[:MAX_MESSAGE]
    for fragment in fragments:
        assert fragment in message, (fragment, message)


# --- tensors the checkpoint does not hold ------------------------------------------------------------
def _missing_cases(tmp: Path):
    part = _save(tmp / "part.safetensors", drop=("layers.1.weight",))
    many = _save(tmp / "many.safetensors", drop=tuple(f"layers.{i}.weight" for i in range(12)), depth=12)
    fix = "strict=True"
    return [
        (
            "dispatch over a dict map",
            lambda: load_checkpoint_and_dispatch(_empty(), part, device_map={"": "cpu"}),
            ["not found in the checkpoint", str(part), "'layers.1.weight'", fix],
        ),
        (
            "dispatch over an auto map",
            lambda: load_checkpoint_and_dispatch(_empty(), part, device_map="auto"),
            ["not found in the checkpoint", "'layers.1.weight'", fix],
        ),
        (
            "load without a map",
            lambda: load_checkpoint_and_dispatch(_empty(), part),
            ["not found in the checkpoint", "'layers.1.weight'"],
        ),
        (
            "twelve missing: ten named, then a count",
            lambda: load_checkpoint_and_dispatch(_empty(depth=12), many, device_map={"": "cpu"}),
            ["12 parameter(s)/buffer(s)", "'layers.9.weight'", "... and 2 more (12 in all)"],
        ),
        (
            "strict loading names them",
            lambda: load_checkpoint_in_model(_empty(), part, strict=True),
            ["does not match the model", "1 missing key(s)", "'layers.1.weight'", str(part)],
        ),
        (
            "dispatch_model of an unloaded model",
            lambda: dispatch_model(_empty(), {"": "cpu"}),
            ["dispatch_model", "hold no data", "'layers.0.weight'", "load_checkpoint_in_model"],
        ),
        (
            "dispatch_model with a cpu + meta split",
            lambda: dispatch_model(
                _empty(), {"layers.0": "cpu", "layers.1": "disk", "scale": "cpu"}, offload_index={}
            ),
            ["dispatch_model", "hold no data", "'layers.1.weight'"],
        ),
        (
            "cpu_offload of an unloaded model",
            lambda: cpu_offload(_empty(), execution_device="cpu"),
            ["cpu_offload", "hold no data"],
        ),
        (
            "disk_offload of an unloaded model",
            lambda: disk_offload(_empty(), tmp / "off", execution_device="cpu"),
            ["disk_offload", "hold no data"],
        ),
    ]


def test_tensors_left_on_meta_are_named_with_the_checkpoint_and_fix(tmp_path):
    for name, call, fragments in _missing_cases(tmp_path):
        with pytest.raises(ValueError) as error:
            call()
        assert "Cannot copy out of meta tensor" not in str(error.value), name
        _check(error, fragments)


def test_non_strict_loading_warns_which_tensors_hold_no_data(tmp_path, caplog):
    part = _save(tmp_path / "part.safetensors", drop=("layers.1.weight",))
    model = _empty()
    with caplog.at_level(logging.WARNING):
        missing, unexpected = load_checkpoint_in_model(model, part)
    assert missing == ["layers.1.weight"] and unexpected == []
    assert "hold no data" in caplog.text and str(part) in caplog.text


# --- devices this machine does not have --------------------------------------------------------------
def _device_cases(tmp: Path):
    full = _save(tmp / "full.safetensors")
    absent = _absent_device()
    maps = [{"": absent}, {"": f"cuda:{absent}"}, {"layers": "cpu", "scale": absent}]
    if absent == 0:
        maps += [{"": "cuda"}, {"": torch.device("cuda")}]
    cases = []
    for device_map in maps:
        cases += [
            ("dispatch_model", lambda m=device_map: dispatch_model(Net(), m)),
            (
                "load_checkpoint_in_model",
                lambda m=device_map: load_checkpoint_in_model(_empty(), full, device_map=m),
            ),
            (
                "load_checkpoint_and_dispatch",
                lambda m=device_map: load_checkpoint_and_dispatch(_empty(), full, m),
            ),
            ("load_state_dict", lambda m=device_map: load_state_dict(full, device_map=m)),
        ]
    cases.append(("cpu_offload", lambda: cpu_offload(Net(), execution_device=absent)))
    return cases


def test_a_device_that_is_not_visible_is_a_value_error_with_the_fix(tmp_path):
    for name, call in _device_cases(tmp_path):
        with pytest.raises(ValueError) as error:
            call()
        _check(error, ["cuda:", "is visible", "Fix:", "device_map={'': 'cpu'}", "'auto'"])
        assert name  # the case id shows in the traceback on failure


# --- max_memory --------------------------------------------------------------------------------------
MAX_MEMORY_CASES = [
    (
        {"cpu": float("inf")},
        ValueError,
        ["max_memory['cpu']", "finite", "'10GiB'", "'500MB'", "int of bytes"],
    ),
    ({"cpu": float("nan")}, ValueError, ["max_memory['cpu']", "finite", "'10GiB'"]),
    ({"cpu": -1}, ValueError, ["max_memory['cpu']", "negative", "'10GiB'"]),
    ({0: -1.5}, ValueError, ["max_memory[0]", "negative"]),
    ({"cpu": "-5GB"}, ValueError, ["max_memory['cpu']", "'-5GB'", "10GiB"]),
    ({"cpu": "inf"}, ValueError, ["max_memory['cpu']", "'inf'"]),
    ({"cpu": "9" * 100_000 + "GB"}, ValueError, ["max_memory['cpu']", "(100002 characters)"]),
    ({"cpu": [1]}, TypeError, ["max_memory['cpu']", "'10GiB'"]),
]


@pytest.mark.parametrize("max_memory, error, fragments", MAX_MEMORY_CASES)
def test_bad_max_memory_values_name_the_device_key(max_memory, error, fragments):
    with pytest.raises(error) as info:
        get_max_memory(max_memory)
    _check(info, fragments)
    with pytest.raises(error):
        infer_auto_device_map(Net(), max_memory=max_memory)


# --- crafted safetensors files -----------------------------------------------------------------------
def _safetensors_cases(tmp: Path):
    f32 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    return [
        (
            "header length 2**60",
            _raw_safetensors(tmp / "huge.safetensors", {}, length=2**60),
            ["header claims"],
        ),
        (
            "header past the end",
            _raw_safetensors(tmp / "long.safetensors", {}, length=10_000),
            ["header claims"],
        ),
        ("too short", _write(tmp / "short.safetensors", b"\x01\x02"), ["shorter than"]),
        (
            "header not JSON",
            _write(tmp / "nojson.safetensors", struct.pack("<Q", 3) + b"\xff\xfe{"),
            ["JSON"],
        ),
        ("header a list", _raw_safetensors(tmp / "list.safetensors", [1, 2]), ["JSON list"]),
        ("entry malformed", _raw_safetensors(tmp / "bad.safetensors", {"w": 3}), ["malformed"]),
        (
            "offsets outside the data",
            _raw_safetensors(tmp / "out.safetensors", {"w": {**f32, "data_offsets": [0, 2**62]}}, b"\0" * 16),
            ["outside the 16 data bytes"],
        ),
        (
            "shape larger than the data",
            _raw_safetensors(tmp / "shape.safetensors", {"w": {**f32, "shape": [2**40]}}, b"\0" * 16),
            ["bytes of data"],
        ),
    ]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_crafted_safetensors_headers_are_refused_naming_the_file(tmp_path):
    for name, path, fragments in _safetensors_cases(tmp_path):
        calls = [
            lambda p=path: read_safetensors_header(p),
            lambda p=path: load_checkpoint_in_model(_empty(), p),
            lambda p=path: load_state_dict(p),
            lambda p=path: safetensors_view(p, "w"),
        ]
        for call in calls:
            with pytest.raises(ValueError) as error:
                call()
            _check(error, [str(path), "not a valid safetensors file", "Fix:", *fragments])
            assert name


def test_an_error_of_the_safetensors_library_is_re_raised_naming_the_file(tmp_path):
    # A dtype we do not map ourselves passes our header checks; the library refuses it.
    path = _raw_safetensors(
        tmp_path / "zz.safetensors", {"w": {"dtype": "ZZ", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4
    )
    with pytest.raises(ValueError) as error:
        load_state_dict(path)
    _check(error, [str(path), "not a valid safetensors file"])
    with pytest.raises(ValueError) as error:
        safetensors_view(path, "w")
    _check(error, [str(path), "'ZZ'"])


# --- .bin pickles: weights_only=True, always ---------------------------------------------------------
class _Payload:
    canary = ""

    def __reduce__(self):
        return (os.system, (f"touch {self.canary}",))


class _Plain:
    pass


def test_bin_checkpoints_never_run_code_and_refusals_name_the_file(tmp_path):
    canary = tmp_path / "CODE_RAN"
    payload = _Payload()
    payload.canary = str(canary)
    evil = tmp_path / "evil.bin"
    torch.save({"layers.0.weight": torch.zeros(4, 4), "x": payload}, evil)
    plain = tmp_path / "plain.bin"
    torch.save({"layers.0.weight": torch.zeros(4, 4), "x": _Plain()}, plain)
    listed = tmp_path / "list.bin"
    torch.save([torch.zeros(1)], listed)
    scalar = tmp_path / "scalar.bin"
    torch.save({"layers.0.weight": 3}, scalar)
    cases = [
        (evil, ["system", "weights_only=True", "add_safe_globals"]),
        (plain, [_Plain.__qualname__, "weights_only=True"]),
        (listed, ["not a state dict"]),
        (scalar, ["'layers.0.weight' is a int, not a tensor"]),
    ]
    for path, fragments in cases:
        for call in (lambda p=path: load_checkpoint_in_model(_empty(), p), lambda p=path: load_state_dict(p)):
            with pytest.raises(ValueError) as error:
                call()
            _check(error, [str(path), *fragments])
    assert not canary.exists()


# --- shard indexes confined to their folder ----------------------------------------------------------
class _Recorder:
    """Record every path opened or stat'ed (builtins, io, os, safetensors, torch.load) during a call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import safetensors

        self.paths: list[str] = []
        for owner, name in (
            (builtins, "open"),
            (io, "open"),
            (os, "open"),
            (os, "stat"),
            (os, "lstat"),
            (safetensors, "safe_open"),
            (torch, "load"),
        ):
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name)))

    def _wrap(self, original):
        def recording(path, *args, **kwargs):
            if isinstance(path, (str, bytes, os.PathLike)):
                self.paths.append(os.path.abspath(os.fsdecode(path)))
            return original(path, *args, **kwargs)

        return recording

    def outside(self, folder: Path) -> list[str]:
        root = os.path.abspath(folder)
        return [p for p in self.paths if os.path.commonpath([p, root]) != root]


INDEX_ENTRIES = [
    "../outside.safetensors",
    "../../outside.safetensors",
    "sub/../../outside.safetensors",
    "{outside}",  # the absolute path of the (valid) canary file
    "/etc/passwd",
]


@pytest.mark.parametrize("entry", INDEX_ENTRIES)
def test_shard_index_entries_outside_the_folder_are_refused_untouched(tmp_path, monkeypatch, entry):
    folder = tmp_path / "deep" / "ckpt"
    folder.mkdir(parents=True)
    outside = _save(tmp_path / "deep" / "outside.safetensors")  # a valid canary: loading it would succeed
    _save(tmp_path / "outside.safetensors")
    inside = _save(folder / "inside.safetensors", drop=("layers.1.weight",))
    entry = entry.format(outside=outside)
    index = folder / "model.safetensors.index.json"
    weight_map = {
        name: inside.name for name in ("layers.0.weight", "layers.0.bias", "scale", "layers.1.bias")
    }
    weight_map["layers.1.weight"] = entry
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for target in (index, folder):
        model = _empty()
        recorder = _Recorder(monkeypatch)
        with pytest.raises(ValueError) as error:
            load_checkpoint_and_dispatch(model, target, device_map={"": "cpu"})
        monkeypatch.undo()
        _check(error, [str(index), quote_value(entry, 120), "points outside the index's folder", "Fix:"])
        assert os.path.abspath(index) in recorder.paths  # the recorder sees what is read
        assert recorder.outside(folder) == [], recorder.outside(folder)
        assert all(p.device.type == "meta" for p in model.parameters())  # refused before loading anything


def test_shard_index_that_is_not_an_index_is_a_clear_error(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    cases = [
        ("not json {", "not a readable checkpoint index"),
        ("[1, 2]", "no 'weight_map'"),
        (json.dumps({"weight_map": {"w": 5}}), "is not a file name"),
        (json.dumps({"weight_map": {"w": ""}}), "is not a file name"),
    ]
    for text, fragment in cases:
        index = folder / "model.safetensors.index.json"
        index.write_text(text)
        with pytest.raises(ValueError) as error:
            checkpoint_files(index)
        _check(error, [str(index), fragment])


def test_a_shard_in_a_subfolder_of_the_index_still_loads(tmp_path):
    folder = tmp_path / "ckpt"
    (folder / "shards").mkdir(parents=True)
    shard = _save(folder / "shards" / "all.safetensors")
    names = list(Net().state_dict())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": dict.fromkeys(names, "shards/" + shard.name)})
    )
    model = load_checkpoint_and_dispatch(_empty(), folder, device_map={"": "cpu"})
    assert model(torch.ones(1, 4)).shape == (1, 4)


def test_an_index_past_the_visible_accelerators_names_how_many_there_are(monkeypatch):
    from accelerando.big_modeling import budgets
    from accelerando.core.devices.families import CUDABackend

    monkeypatch.setattr(budgets, "_VISIBLE", {})
    monkeypatch.setattr(CUDABackend, "device_count", classmethod(lambda cls: 2))
    assert budgets.check_device_visible("cuda:1") == 1
    assert budgets.check_device_visible(torch.device("cuda", 0)) == 0
    with pytest.raises(ValueError) as error:
        budgets.check_device_visible(2, "device_map['layers']")
    _check(error, ["device_map['layers']", "only 2 cuda device(s) are visible (indices 0 to 1)", "Fix:"])
    with pytest.raises(ValueError) as error:
        budgets.check_device_visible(True)
    _check(error, ["Unknown device True"])
