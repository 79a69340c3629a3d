"""accelerando.common.serialization: save / load / clean_state_dict_for_safetensors."""

from __future__ import annotations

import pytest
import torch

from accelerando.common.serialization import clean_state_dict_for_safetensors, load, save


def test_clean_drops_shared_tensors_and_makes_contiguous() -> None:
    emb = torch.nn.Embedding(4, 3)
    head = torch.nn.Linear(3, 4, bias=False)
    head.weight = emb.weight  # tied
    state = {"emb.weight": emb.weight, "head.weight": head.weight, "t": torch.ones(3, 2).t(), "n": 5}
    cleaned = clean_state_dict_for_safetensors(state)
    assert list(cleaned) == ["emb.weight", "t", "n"]
    assert cleaned["t"].is_contiguous()
    assert cleaned["n"] == 5


def test_clean_keeps_views_of_distinct_storage_and_empty_tensors() -> None:
    state = {"a": torch.zeros(0), "b": torch.zeros(0), "c": torch.ones(2)}
    assert list(clean_state_dict_for_safetensors(state)) == ["a", "b", "c"]


def test_clean_rejects_non_mapping() -> None:
    with pytest.raises(TypeError, match="mapping"):
        clean_state_dict_for_safetensors([torch.ones(1)])  # type: ignore[arg-type]


def test_safetensors_round_trip(tmp_path) -> None:
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "w.safetensors"
    save(model.state_dict(), path, safe_serialization=True)
    loaded = load(path)
    assert set(loaded) == {"weight", "bias"}
    assert torch.equal(loaded["weight"], model.weight.detach())


class Custom:
    """A class the weights-only unpickler does not know."""


def test_torch_round_trip_is_weights_only(tmp_path) -> None:
    path = tmp_path / "obj.bin"
    obj = {"step": 3, "t": torch.arange(4), "names": ["a", "b"]}
    save(obj, path)
    loaded = load(path)
    assert loaded["step"] == 3 and torch.equal(loaded["t"], obj["t"])

    save({"x": Custom()}, tmp_path / "custom.bin")
    with pytest.raises(Exception, match="(?i)weights_only|unsupported global"):
        load(tmp_path / "custom.bin")
    assert isinstance(load(tmp_path / "custom.bin", weights_only=False)["x"], Custom)


def test_safe_serialization_rejects_non_tensors(tmp_path) -> None:
    with pytest.raises(TypeError, match="safe_serialization=False"):
        save({"a": 1}, tmp_path / "x.safetensors", safe_serialization=True)
    with pytest.raises(TypeError, match="mapping"):
        save([1], tmp_path / "x.safetensors", safe_serialization=True)


def test_load_missing_file_names_it(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        load(tmp_path / "nope.bin")
