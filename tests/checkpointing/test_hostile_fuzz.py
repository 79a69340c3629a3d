"""Issue 27, item 7: a standing hostile-input fuzz of the readers of files we do not control.

Random bytes and random structures (hypothesis, ~50 examples each, no deadline) fed to the config-file
reader, the manifest reader, the safetensors header and index readers and the foreign (reference
layout) checkpoint detector never hang (each example runs under a time bound), never run code (the
inputs carry payloads that would create a canary file: YAML python tags, pickles whose ``__reduce__``
calls ``os.system``), and raise only the documented error types.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import struct
import tempfile
import threading
import zipfile
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelerando.big_modeling.discovery import checkpoint_files
from accelerando.big_modeling.offload import read_safetensors_header
from accelerando.checkpointing.files import load_model_weights
from accelerando.checkpointing.foreign import (
    check_file_header,
    check_reference_files,
    is_reference_checkpoint,
)
from accelerando.checkpointing.manifest import MANIFEST_NAME, CheckpointError, Manifest, read_manifest
from accelerando.core.settings.configfile import ConfigError, load_config_layer, read_config_file

FUZZ = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
BOUND_S = 20.0  # per example: generous on a loaded machine; a hang never ends
CANARY = os.path.join(tempfile.gettempdir(), f"accelerando_fuzz_canary_{os.getpid()}")


class Payload:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(CANARY)}",))


def _pickled_payload() -> bytes:
    buffer = io.BytesIO()
    torch.save({"torch_manual_seed": Payload(), "random_state": Payload()}, buffer)
    return buffer.getvalue()


PAYLOAD = _pickled_payload()
YAML_PAYLOADS = [
    f'x: !!python/object/apply:os.system ["touch {CANARY}"]\n',
    f"!!python/object/new:os.system [touch {CANARY}]\n",
    "a: &a [*a]\n",
    "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "compute_environment: LOCAL_MACHINE\nmixed_precision: 7\n",
]

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
json_values = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


def bounded(call: Callable[[], Any], allowed: tuple[type[BaseException], ...]) -> None:
    """Run ``call`` within ``BOUND_S``; it may only return or raise one of ``allowed``; no canary."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            call()
        except BaseException as err:  # noqa: BLE001 - judged by the test thread
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"hung for more than {BOUND_S} s"
    error = box.get("error")
    if error is not None and not isinstance(error, allowed):
        raise AssertionError(f"undocumented error {type(error).__name__}: {error}") from error
    assert not os.path.exists(CANARY), "code ran from the input"


def _write(folder: str, name: str, data: bytes) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as handle:
        handle.write(data)
    return path


# ------------------------------------------------------------------------------------ config files
config_bytes = (
    st.binary(max_size=2048)
    | st.sampled_from(YAML_PAYLOADS).map(str.encode)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.dictionaries(
        st.sampled_from(["compute_environment", "fsdp_config", "num_processes", "zz"]), json_values
    ).map(lambda v: json.dumps(v).encode())
)


@FUZZ
@given(data=config_bytes, suffix=st.sampled_from([".yaml", ".json"]))
def test_fuzz_config_reader(data: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, f"config{suffix}", data)
        bounded(lambda: read_config_file(path), (ConfigError,))
        bounded(lambda: load_config_layer(path), (ConfigError,))


# -------------------------------------------------------------------------------------- manifests
manifest_bytes = (
    st.binary(max_size=2048)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.fixed_dictionaries(
        {"format": json_values, "files": st.dictionaries(st.text(max_size=30), json_values, max_size=4)},
        optional={"version": json_values, "meta": json_values},
    ).map(lambda v: json.dumps(v).encode())
)


@FUZZ
@given(data=manifest_bytes)
def test_fuzz_manifest_reader(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        _write(folder, MANIFEST_NAME, data)
        bounded(lambda: read_manifest(folder), (CheckpointError,))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return
        bounded(lambda: Manifest.from_json(text), (ValueError,))  # CheckpointError is a ValueError too


# ----------------------------------------------------------------------------- safetensors / index
def _safetensors(header: Any, length: int | None, tail: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + tail


header_entries = st.dictionaries(
    st.text(max_size=10),
    st.fixed_dictionaries(
        {
            "dtype": st.sampled_from(["F32", "F16", "I64", "XX", 3]),
            "shape": json_values,
            "data_offsets": json_values,
        }
    )
    | json_values,
    max_size=4,
)
safetensors_bytes = st.binary(max_size=512) | st.builds(
    _safetensors,
    header_entries | st.binary(max_size=64),
    st.none() | st.sampled_from([0, 1, 7, 2**62, 2**64 - 1, 100_000_001]) | st.integers(0, 4096),
    st.binary(max_size=256),
)


@FUZZ
@given(data=safetensors_bytes)
def test_fuzz_safetensors_readers(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, "model.safetensors", data)
        bounded(lambda: read_safetensors_header(path), (ValueError,))
        bounded(lambda: check_file_header(path), (CheckpointError,))
        bounded(lambda: load_model_weights(path), (CheckpointError,))


index_bytes = (
    st.binary(max_size=1024)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.dictionaries(
        st.text(max_size=10),
        st.sampled_from(["a.safetensors", "../x", "/etc/passwd", "", "b\x00c", "sub/../../y"]) | json_values,
        max_size=4,
    ).map(lambda m: json.dumps({"weight_map": m}).encode())
)


@FUZZ
@given(data=index_bytes)
def test_fuzz_index_reader(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, "model.safetensors.index.json", data)
        bounded(lambda: checkpoint_files(path), (ValueError,))


# --------------------------------------------------------------------------- foreign checkpoints
def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


rng_bytes = (
    st.binary(max_size=1024)
    | st.just(PAYLOAD)
    | st.dictionaries(
        st.sampled_from(["archive/data.pkl", "x/data.pkl", "archive/version", "data.pkl"]),
        st.binary(max_size=256) | st.just(b"torch_manual_seed") | st.just(PAYLOAD),
        max_size=3,
    ).map(_zip)
    | st.binary(max_size=256).map(lambda b: PAYLOAD[: len(PAYLOAD) // 2] + b)
)
layout_names = st.lists(
    st.sampled_from(
        [
            "model.safetensors",
            "pytorch_model.bin",
            "optimizer.bin",
            "scheduler.bin",
            "scaler.pt",
            "custom_checkpoint_0.pkl",
        ]
    ),
    max_size=3,
    unique=True,
)


@FUZZ
@given(rng=rng_bytes, others=layout_names, other_data=st.binary(max_size=256) | safetensors_bytes)
def test_fuzz_foreign_checkpoint_detector(rng: bytes, others: list[str], other_data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        _write(folder, "random_states_0.pkl", rng)
        for name in others:
            _write(folder, name, other_data)
        present = {name: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)}
        result: dict[str, Any] = {}
        bounded(lambda: result.setdefault("is", is_reference_checkpoint(present, folder)), ())
        assert isinstance(result["is"], bool)
        bounded(lambda: check_reference_files(folder, present), (CheckpointError,))


@pytest.fixture(autouse=True)
def _no_canary() -> Any:
    yield
    assert not os.path.exists(CANARY), "code ran from a fuzzed input"
