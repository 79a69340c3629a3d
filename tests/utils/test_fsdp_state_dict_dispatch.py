"""save/load_fsdp_model and save/load_fsdp_optimizer choose their format from the plugin's state_dict_type.

Only the choice and the refusals are checked here (one process, no process group); the round trips
run in two real processes in test_utils_fsdp_save_load_distributed.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from accelerando.backends.strategies.fsdp import checkpoint as fsdp


def _model() -> torch.nn.Module:
    return torch.nn.Linear(2, 2)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "FULL_STATE_DICT"),
        ("FULL_STATE_DICT", "FULL_STATE_DICT"),
        ("sharded_state_dict", "SHARDED_STATE_DICT"),
        ("StateDictType.LOCAL_STATE_DICT", "LOCAL_STATE_DICT"),
    ],
)
def test_state_dict_type_spellings(value, expected):
    assert fsdp._handlers(SimpleNamespace(state_dict_type=value)) is fsdp._HANDLERS[expected]


def test_torch_enum_is_accepted():
    from torch.distributed.fsdp import StateDictType

    plugin = SimpleNamespace(state_dict_type=StateDictType.SHARDED_STATE_DICT)
    assert fsdp._handlers(plugin) is fsdp._HANDLERS["SHARDED_STATE_DICT"]


def test_unknown_type_is_refused_before_anything_is_written(tmp_path):
    plugin = SimpleNamespace(state_dict_type="HALF_STATE_DICT")
    with pytest.raises(ValueError, match="FULL_STATE_DICT, SHARDED_STATE_DICT, LOCAL_STATE_DICT"):
        fsdp.save_fsdp_model(plugin, None, _model(), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="HALF_STATE_DICT"):
        fsdp.load_fsdp_optimizer(plugin, None, None, _model(), str(tmp_path))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda plugin, d: fsdp.save_fsdp_model(plugin, None, _model(), d, use_dcp=False),
        lambda plugin, d: fsdp.load_fsdp_model(plugin, None, _model(), d, use_dcp=False),
        lambda plugin, d: fsdp.save_fsdp_optimizer(plugin, None, None, _model(), d, use_dcp=False),
        lambda plugin, d: fsdp.load_fsdp_optimizer(plugin, None, None, _model(), d, use_dcp=False),
    ],
)
def test_sharded_without_dcp_is_refused(tmp_path, call):
    with pytest.raises(ValueError, match="use_dcp=True"):
        call(SimpleNamespace(state_dict_type="SHARDED_STATE_DICT"), str(tmp_path))


def test_local_state_dict_needs_an_fsdp1_model(tmp_path):
    plugin = SimpleNamespace(state_dict_type="LOCAL_STATE_DICT")
    with pytest.raises(ValueError, match="FSDP1"):
        fsdp.save_fsdp_model(plugin, None, _model(), str(tmp_path))
    # the local optimizer state is the sharded one
    with pytest.raises(ValueError, match="use_dcp=True"):
        fsdp.save_fsdp_optimizer(plugin, None, None, _model(), str(tmp_path), use_dcp=False)


def test_missing_files_name_the_path(tmp_path):
    full = SimpleNamespace(state_dict_type="FULL_STATE_DICT")
    with pytest.raises(FileNotFoundError, match="pytorch_model_fsdp_2.bin"):
        fsdp.load_fsdp_model(full, None, _model(), str(tmp_path), model_index=2)
    with pytest.raises(FileNotFoundError, match="optimizer.bin"):
        fsdp.load_fsdp_optimizer(full, None, None, _model(), str(tmp_path))
    local = SimpleNamespace(state_dict_type="LOCAL_STATE_DICT")
    with pytest.raises(FileNotFoundError, match="pytorch_model_fsdp_rank0.bin"):
        fsdp.load_fsdp_model(local, None, _model(), str(tmp_path))
