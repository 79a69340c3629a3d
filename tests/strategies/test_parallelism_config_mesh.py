"""ParallelismConfig's mesh plan: the axis order, the flattened views, and no early world-size check."""

from __future__ import annotations

from unittest import mock

import pytest

from accelerando.parallelism_config import ParallelismConfig


@pytest.fixture(autouse=True)
def _no_parallelism_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in [k for k in os.environ if k.startswith("PARALLELISM_CONFIG_")]:
        monkeypatch.delenv(key)


@pytest.mark.parametrize(
    ("sizes", "names", "shape"),
    [
        ({}, None, None),
        ({"dp_replicate_size": 2, "dp_shard_size": 4}, ("dp_replicate", "dp_shard"), (2, 4)),
        ({"dp_shard_size": 2, "cp_size": 2, "tp_size": 2}, ("dp_shard", "cp", "tp"), (2, 2, 2)),
        ({"dp_shard_size": 2, "sp_size": 2}, ("dp_shard", "sp"), (2, 2)),
    ],
)
def test_get_mesh_orders_the_enabled_axes(sizes: dict, names: tuple | None, shape: tuple | None) -> None:
    plan = ParallelismConfig(**sizes)._get_mesh()
    assert plan == (() if names is None else (names, shape))


def test_build_device_mesh_does_not_check_the_live_world_size() -> None:
    """A mesh for 8 processes can be built (here: with a stand-in init) in a 1-process session."""
    made = mock.MagicMock()
    with mock.patch("torch.distributed.device_mesh.init_device_mesh", return_value=made) as init:
        config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2)
        assert config.build_device_mesh("cpu") is made
    init.assert_called_once_with("cpu", (2, 2, 2), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    sliced = [c.args[0] for c in made.__getitem__.call_args_list]
    assert sliced == [["dp_replicate", "dp_shard"], ["dp_shard"], ["dp_replicate", "dp_shard"]]
    assert ParallelismConfig().build_device_mesh("cpu") is None
    with pytest.raises(ValueError, match="= 8 processes but the job has 1"):
        config.validate(1)
