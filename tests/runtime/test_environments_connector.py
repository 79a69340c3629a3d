"""Cluster-environment detection, device detection and the connector's decisions (no processes)."""

from __future__ import annotations

import pytest
import torch

from accelerando.backends.connector import decide, process_distributed_type
from accelerando.core.devices import CPUBackend, CUDABackend, backend_for, detect_device_backend
from accelerando.core.enums import DistributedType
from accelerando.core.environments import (
    MPIEnvironment,
    SingleProcessEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    detect_environment,
)
from accelerando.core.environments.slurm import first_host
from accelerando.state import PartialState, _split

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "1234",
}


def test_torchrun_environment():
    env = detect_environment(TORCHRUN)
    assert isinstance(env, TorchElasticEnvironment)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (3, 8, 1, 2, 1)
    assert (env.main_address, env.main_port) == ("10.0.0.1", 1234)


@pytest.mark.parametrize(
    "variables",
    [
        {
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        },
        {"PMI_SIZE": "4", "PMI_RANK": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
        {
            "MV2_COMM_WORLD_SIZE": "4",
            "MV2_COMM_WORLD_RANK": "2",
            "MV2_COMM_WORLD_LOCAL_RANK": "0",
            "MV2_COMM_WORLD_LOCAL_SIZE": "2",
        },
    ],
    ids=["openmpi", "mpich-intel", "mvapich"],
)
def test_mpi_flavours(variables):
    env = detect_environment({**variables, "MASTER_ADDR": "head"})
    assert isinstance(env, MPIEnvironment)
    assert (env.world_size, env.rank, env.local_rank, env.local_world_size, env.node_rank) == (4, 2, 0, 2, 1)
    assert env.main_address == "head"


def test_slurm_environment_and_nodelist():
    variables = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "gpu[007-010,12],cpu1",
        "SLURM_JOB_ID": "4242",
        "SLURM_TASKS_PER_NODE": "2(x4)",
    }
    env = detect_environment(variables)
    assert isinstance(env, SLURMEnvironment)
    assert (env.rank, env.world_size, env.local_rank, env.node_rank, env.local_world_size) == (5, 8, 1, 2, 2)
    assert env.main_address == "gpu007"
    assert env.main_port == 15000 + 4242
    assert first_host("node1") == "node1"
    assert first_host("a[3,5]") == "a3"
    with pytest.raises(ValueError, match="node list"):
        first_host("")


def test_torchrun_inside_slurm_wins_and_salloc_shell_is_single():
    both = {**TORCHRUN, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}
    assert isinstance(detect_environment(both), TorchElasticEnvironment)
    assert isinstance(
        detect_environment({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}), SingleProcessEnvironment
    )
    assert isinstance(detect_environment({}), SingleProcessEnvironment)


def test_bad_integer_names_the_variable():
    env = TorchElasticEnvironment({**TORCHRUN, "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        _ = env.world_size


def test_device_detection_on_this_machine():
    assert detect_device_backend(cpu=True) is CPUBackend
    expected = CUDABackend if torch.cuda.is_available() else CPUBackend
    assert detect_device_backend() is expected
    assert backend_for("cuda") is CUDABackend
    with pytest.raises(ValueError, match="unknown device"):
        backend_for("tpu9")


def test_connector_decisions():
    assert process_distributed_type(CPUBackend, 1) is DistributedType.NO
    assert process_distributed_type(CPUBackend, 2) is DistributedType.MULTI_CPU
    assert process_distributed_type(CUDABackend, 2) is DistributedType.MULTI_GPU
    common = dict(
        num_processes=2,
        process_type=DistributedType.MULTI_CPU,
        deepspeed_requested=False,
        fsdp_requested=False,
        megatron_requested=False,
        requested_type=None,
    )
    assert decide(**common).strategy_name == "ddp"
    assert decide(**{**common, "fsdp_requested": True}).distributed_type is DistributedType.FSDP
    assert decide(**{**common, "deepspeed_requested": True}).strategy_name == "deepspeed"
    single = {**common, "num_processes": 1, "process_type": DistributedType.NO}
    assert decide(**single).strategy_name == "single"
    with pytest.raises(ValueError, match="MULTI_GPU.*config:/x.yaml.*no usable GPU"):
        decide(
            **{**common, "requested_type": "MULTI_GPU"},
            requested_type_source="config:/x.yaml",
            device_name="cpu",
        )


@pytest.mark.parametrize("length", [0, 1, 5, 7, 8])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_split_between_processes_covers_inputs(length, world):
    data = list(range(length))
    parts = [_split(data, world, i, apply_padding=False) for i in range(world)]
    assert sum(parts, []) == data
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    padded = [_split(data, world, i, apply_padding=True) for i in range(world)]
    if length:
        assert len({len(p) for p in padded}) == 1
        for p, q in zip(parts, padded, strict=True):
            assert q[: len(p)] == p
    tensor_parts = [_split(torch.arange(length), world, i, apply_padding=True) for i in range(world)]
    if length:
        assert len({len(t) for t in tensor_parts}) == 1
    dict_parts = [_split({"a": data, "b": data}, world, i, False) for i in range(world)]
    assert sum((d["a"] for d in dict_parts), []) == data


def test_split_rejects_unsliceable():
    with pytest.raises(TypeError, match="cannot split"):
        _split(42, 2, 0, False)
    with pytest.raises(TypeError, match="same length"):
        _split({"a": [1], "b": [1, 2]}, 2, 0, False)


def test_partial_state_is_shared():
    PartialState._reset_state()
    a, b = PartialState(), PartialState()
    assert a.__dict__ is b.__dict__ and a.device == torch.device("cpu")
