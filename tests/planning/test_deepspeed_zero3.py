"""DeepSpeed ZeRO-3 in the planner: the partition sizes, the formula on the FSDP2 simulation, a real run.

The fast tests check the closed forms; the slow one runs DeepSpeed ZeRO-3 through ``Accelerator``
(``DeepSpeedPlugin(zero_stage=3)``, gloo, ``world`` CPU processes) and fails when the predicted peak of
rank 0 is more than 10 % off the measured one or a collective's bytes differ.
"""

from __future__ import annotations

import math

import pytest
from planning_toy import ToyLM

from accelerando.backends.planning.derive import ZERO3_DEFAULTS, Zero3Settings, zero3_from_fsdp2
from accelerando.backends.planning.planner import candidates
from accelerando.backends.planning.report import launch_config
from accelerando.backends.planning.simulate import zero3_sizes
from accelerando.backends.planning.spec import ClusterSpec, MemoryBreakdown, TrainingShape
from accelerando.backends.planning.validation import (
    TOLERANCE,
    VALIDATION_MODELS,
    VALIDATION_SHAPE,
    ZERO3_VARIANTS,
)
from accelerando.common.imports import is_deepspeed_available

FP32 = TrainingShape(micro_batch=2, seq_length=16, mixed_precision="no")


@pytest.mark.parametrize("world", [1, 3, 8])
def test_zero3_sizes_pad_every_parameter_to_the_ranks_and_keep_small_ones_whole(world: int) -> None:
    model = ToyLM()
    numels = [p.numel() for p in model.parameters()]
    sizes = zero3_sizes(model, world, persistence_threshold=100)
    assert sizes["elements"] == sum(numels)
    assert sizes["partition"] == sum(math.ceil(n / world) for n in numels)
    assert sizes["persistent"] == sum(n for n in numels if n <= 100)
    assert sizes["persistent_aligned"] + sizes["gathered_aligned"] == world * sizes["partition"]
    assert sizes["ranks"] == world


def test_the_formula_holds_deepspeeds_buckets_partitions_and_fp32_master() -> None:
    fsdp2 = MemoryBreakdown(parameters=10, gradients=0, optimizer=20, activations=1000, temporaries=300)
    sizes = {"elements": 400, "partition": 100, "persistent": 0, "persistent_aligned": 0}
    sizes |= {"gathered_aligned": 400, "ranks": 4, "buffer_bytes": 8}
    memory, comms, method = zero3_from_fsdp2(fsdp2, {"all_gather (dp)": 1}, sizes, FP32)
    assert memory.gradients == ZERO3_DEFAULTS.reduce_bucket_size * 4 + 100 * 4  # bucket + gradient partition
    assert memory.optimizer == 100 * 4 + 2 * 100 * 4 + 4  # fp32 master + AdamW's two states + its step
    assert memory.parameters == 400 * 4 + 100 * 4 + 8  # all kept gathered (the model is under the window)
    assert (memory.activations, memory.temporaries) == (1000, 300)  # the FSDP2 step's
    assert comms == {"all_reduce (dp)": 8, "reduce_scatter (dp)": 1600, "all_gather (dp)": 1600}
    assert "DeepSpeed" in method
    small = Zero3Settings(reduce_bucket_size=10, prefetch_bucket_size=50, max_live_parameters=100)
    memory, comms, _ = zero3_from_fsdp2(fsdp2, {}, sizes, TrainingShape(mixed_precision="bf16"), small)
    assert memory.gradients == 10 * 2 + 100 * 2
    assert memory.parameters == (100 + 50) * 2 + 100 * 2 + 8  # max_live_parameters + one prefetch bucket
    assert comms["all_gather (dp)"] == (2 * 400 - 100) * 2  # forward and backward, less the kept window
    one = zero3_from_fsdp2(fsdp2, {}, sizes | {"ranks": 1, "partition": 400}, FP32)
    assert "all_gather (dp)" not in one[1] and one[0].parameters == 400 * 4 + 8


def test_settings_come_from_a_zero_optimization_section() -> None:
    settings = Zero3Settings.from_config(
        {"reduce_bucket_size": 4096, "stage3_param_persistence_threshold": "640"}
    )
    assert settings == Zero3Settings(reduce_bucket_size=4096, param_persistence_threshold=640)


def test_the_planner_lists_zero3_beside_fsdp2_and_writes_a_deepspeed_config() -> None:
    from accelerando.backends.planning.planner import Plan
    from accelerando.backends.planning.spec import LayoutEstimate

    cluster = ClusterSpec(gpus_per_machine=4)
    zero3 = next(c for c in candidates(cluster, 4, (4, 2)) if c.name == "zero3")
    assert (zero3.dp_shard, zero3.zero_stage) == (4, 3)
    estimate = LayoutEstimate(zero3, MemoryBreakdown(parameters=1), {}, "formula", fits=True)
    config = launch_config(Plan("m", FP32, cluster, [estimate]))
    assert config["distributed_type"] == "DEEPSPEED"
    assert config["deepspeed_config"] == {"zero_stage": 3}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # DeepSpeed's import and engine start in every rank: minutes on 2 shared cores
@pytest.mark.skipif(not is_deepspeed_available(), reason="needs deepspeed (pip install deepspeed)")
@pytest.mark.usefixtures("deepspeed_cpu_op")
@pytest.mark.parametrize("layout", list(ZERO3_VARIANTS))
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("model", VALIDATION_MODELS)
def test_zero3_prediction_matches_a_real_deepspeed_run(model: str, world: int, layout: str) -> None:
    """Rank 0 of DeepSpeed ZeRO-3 through ``Accelerator`` (gloo, ``world`` CPU processes) against the formula."""
    from planning_deepspeed import DEEPSPEED_ENV, measure_zero3_on_rank

    from accelerando.backends.planning.validation import compare
    from accelerando.test_utils.distributed import run_distributed

    measured = run_distributed(
        measure_zero3_on_rank, world, model, VALIDATION_SHAPE, layout, env=DEEPSPEED_ENV, timeout=1800
    )[0]
    (row,) = compare(world, measured)
    assert row.peak_error is not None and abs(row.peak_error) <= TOLERANCE, (row.peak_error, row)
    assert row.collectives_equal, (row.predicted, row.measured)
