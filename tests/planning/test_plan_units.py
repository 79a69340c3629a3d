"""Fast unit tests of the planner's pure parts: specs, candidates, the cost model, derived layouts, reports."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from accelerando.backends.planning import report
from accelerando.backends.planning.cost import communication_seconds, step_flops
from accelerando.backends.planning.derive import offload_from, pp_dp_from_ddp, zero1_from_ddp
from accelerando.backends.planning.planner import Plan, _scale, candidates
from accelerando.backends.planning.simulate import StepCount
from accelerando.backends.planning.spec import (
    Candidate,
    ClusterSpec,
    LayoutEstimate,
    MemoryBreakdown,
    TrainingShape,
)
from accelerando.core.settings.configfile import config_to_layer

GIB = 1024**3


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"micro_batch": 0}, "micro_batch"),
        ({"mixed_precision": "fp16"}, "mixed_precision"),
        ({"optimizer": "lion"}, "optimizer"),
    ],
)
def test_a_bad_training_shape_names_the_field(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        TrainingShape(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"num_machines": 0}, "num_machines"),
        ({"headroom": 1.0}, "headroom"),
        ({"device_flops": 0}, "device_flops"),
    ],
)
def test_a_bad_cluster_names_the_field(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ClusterSpec(**kwargs)


def test_candidates_respect_heads_layers_and_machines() -> None:
    cluster = ClusterSpec(num_machines=2, gpus_per_machine=8)
    names = [c.name for c in candidates(cluster, num_layers=32, heads=(32, 8))]
    assert names[:6] == ["ddp", "zero1", "zero2", "fsdp2", "zero3", "hsdp"]
    assert {"fsdp2_tp2", "fsdp2_tp4", "fsdp2_tp8", "pp2_dp", "pp4_dp", "pp8_dp", "fsdp2+offload"} <= set(
        names
    )
    assert all(c.world_size == 16 for c in candidates(cluster, 32, (32, 8)))
    # 12 heads: tp=8 does not divide them; 6 layers: only pp=2 divides them
    names = [c.name for c in candidates(ClusterSpec(gpus_per_machine=8), num_layers=6, heads=(12, 12))]
    assert "fsdp2_tp8" not in names and "fsdp2_tp4" in names and "hsdp" not in names
    assert [n for n in names if n.startswith("pp")] == ["pp2_dp"]
    assert [c.name for c in candidates(cluster, 32, (32, 8), only=["fsdp2"])][0] == "fsdp2"


@given(st.integers(1, 4096), st.sampled_from(["all_gather (dp)", "reduce_scatter (dp)", "all_reduce (dp)"]))
def test_ring_cost_is_bytes_times_the_ring_factor_over_bandwidth(world: int, key: str) -> None:
    cluster = ClusterSpec(num_machines=1, gpus_per_machine=max(world, 1))
    size = 10**9
    seconds = communication_seconds({key: size}, Candidate("x", dp_shard=world, zero_stage=3), cluster)
    factor = (2 if key.startswith("all_reduce") else 1) * (world - 1) / world
    assert seconds == pytest.approx(size * factor / cluster.intra_node_bandwidth)


def test_collectives_spanning_machines_use_the_inter_node_bandwidth() -> None:
    cluster = ClusterSpec(num_machines=2, gpus_per_machine=4)
    inside = communication_seconds(
        {"all_reduce (tp)": 8 * 10**9}, Candidate("t", tp=4, dp_shard=2, zero_stage=3), cluster
    )
    across = communication_seconds(
        {"all_gather (dp)": 8 * 10**9}, Candidate("f", dp_shard=8, zero_stage=3), cluster
    )
    assert inside == pytest.approx(8e9 * 2 * 3 / 4 / 200e9)
    assert across == pytest.approx(8e9 * 7 / 8 / 25e9)


def test_step_flops_follow_the_documented_formula() -> None:
    shape = TrainingShape(micro_batch=2, seq_length=1024)
    plain = step_flops(10**9, shape, Candidate("d"), num_layers=24, hidden_size=2048)
    assert plain == (6 * 10**9 + 12 * 24 * 2048 * 1024) * 2048
    assert step_flops(10**9, shape, Candidate("t", tp=4), 24, 2048) == plain / 4
    checkpointed = TrainingShape(micro_batch=2, seq_length=1024, activation_checkpointing=True)
    assert step_flops(10**9, checkpointed, Candidate("d"), 24, 2048) == pytest.approx(plain * 4 / 3)
    # pp=4 stages, 4 micro-batches: the same work per device as no pipeline, times the (4+3)/4 bubble
    assert step_flops(10**9, shape, Candidate("p", pp=4), 24, 2048) == pytest.approx(plain * 7 / 4)


MEM = MemoryBreakdown(parameters=400, gradients=400, optimizer=800, activations=1000, temporaries=100)


def test_derived_layouts() -> None:
    zero1, comms, method = zero1_from_ddp(MEM, {"all_reduce (dp)": 400}, Candidate("z", dp_replicate=4), 400)
    assert zero1.optimizer == 200 and zero1.parameters == 400 and comms["all_gather (dp)"] == 400
    assert method.startswith("formula")
    shape = TrainingShape(micro_batch=1, seq_length=8, mixed_precision="bf16")
    pp, comms, _ = pp_dp_from_ddp(MEM, {"all_reduce (dp)": 400}, Candidate("p", pp=2), shape, hidden_size=16)
    assert (pp.parameters, pp.optimizer, pp.activations) == (200, 400, 1000)
    assert comms == {"all_reduce (dp)": 200, "send_recv (pp)": 2 * 2 * 8 * 16 * 2}
    off, comms, _ = offload_from(MEM, {}, 100, "fsdp2")
    assert (off.parameters, off.gradients, off.optimizer) == (300, 300, 0) and comms["host transfers"] == 200


def test_linear_extrapolation_of_counts() -> None:
    two = StepCount(MemoryBreakdown(parameters=20, activations=2), {"all_gather (dp)": 200}, 10, 1000)
    four = StepCount(MemoryBreakdown(parameters=40, activations=4), {"all_gather (dp)": 400}, 20, 2000)
    eight = _scale(two, four, 2, 4, 8)
    assert eight.memory.parameters == 80 and eight.memory.activations == 8
    assert eight.collective_bytes == {"all_gather (dp)": 800} and eight.num_parameters == 4000


def _plan(candidate: Candidate, fits: bool = True) -> Plan:
    estimate = LayoutEstimate(candidate, MEM, {"all_gather (dp)": GIB}, "simulated", 1.0, 0.5, fits)
    return Plan(
        "m", TrainingShape(), ClusterSpec(num_machines=2, gpus_per_machine=8), [estimate], [], ["why"]
    )


@pytest.mark.parametrize(
    ("candidate", "distributed_type"),
    [
        (Candidate("ddp", dp_replicate=16), "MULTI_GPU"),
        (Candidate("zero1", dp_replicate=16, zero_stage=1), "DEEPSPEED"),
        (Candidate("fsdp2", dp_shard=16, zero_stage=3), "FSDP"),
        (Candidate("hsdp", dp_shard=8, dp_replicate=2, zero_stage=3), "FSDP"),
        (Candidate("fsdp2_tp4", tp=4, dp_shard=4, zero_stage=3), "FSDP"),
        (Candidate("fsdp2+offload", dp_shard=16, zero_stage=3, offload=True), "FSDP"),
    ],
)
def test_the_written_config_is_one_accelerando_launch_reads(
    tmp_path, candidate: Candidate, distributed_type: str
) -> None:
    path = report.write_config(_plan(candidate), tmp_path / "plan.yaml")
    text = path.read_text()
    assert text.startswith("# written by `accelerando plan`")
    data = yaml.safe_load(text)
    assert data["distributed_type"] == distributed_type and data["num_processes"] == 16
    layer = config_to_layer(data, str(path))  # unknown keys or bad values raise here
    if candidate.tp > 1:
        assert layer["parallelism_config_tp_size"].value == 4
    if candidate.offload:
        assert layer["fsdp_offload_params"].value is True


def test_no_config_when_nothing_fits(tmp_path) -> None:
    with pytest.raises(ValueError, match="no layout fits"):
        report.write_config(_plan(Candidate("ddp", dp_replicate=16), fits=False), tmp_path / "x.yaml")


def test_the_table_says_it_is_a_simulation_and_lists_every_layout() -> None:
    text = report.format_table(_plan(Candidate("fsdp2", dp_shard=16, zero_stage=3)))
    assert text.startswith("SIMULATION")
    assert "fsdp2" in text and "all_gather (dp) 1 GiB" in text and "why" in text


def test_the_plan_command_names_a_model_it_cannot_find() -> None:
    from accelerando.commands.cli import main

    with pytest.raises(SystemExit, match="no model 'no-such-model'.*nothing is downloaded"):
        main(["plan", "no-such-model", "--gpus_per_machine", "2"])


def test_the_plan_command_refuses_a_bad_memory_size() -> None:
    from accelerando.commands.cli import main

    with pytest.raises(SystemExit, match="not a memory size"):
        main(["plan", "tiny-llama", "--device_memory", "lots"])


def test_estimate_memory_with_plan_runs_the_planner(capsys: pytest.CaptureFixture[str]) -> None:
    from accelerando.commands.cli import main

    code = main(
        ["estimate-memory", "planning_toy:toy_model", "--plan", "--gpus_per_machine", "1", "--layouts", "ddp"]
    )
    out = capsys.readouterr().out
    assert code in (0, None)
    assert out.startswith("SIMULATION") and "planning_toy:toy_model on 1 x 1 devices" in out
    assert "chosen ddp" in out and "Training using Adam" not in out


def test_estimate_memory_with_plan_names_a_bad_plan_argument() -> None:
    from accelerando.commands.cli import main

    with pytest.raises(SystemExit, match="not a memory size"):
        main(["estimate-memory", "tiny-llama", "--plan", "--device_memory", "lots"])
