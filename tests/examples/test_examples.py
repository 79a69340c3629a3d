"""Every example in ``examples/`` runs at tiny size on 2 CPU processes through ``accelerando launch``.

Each example prints its results as one ``METRICS {json}`` line; the tests assert on those numbers
(loss went down, accuracy above chance, files written, processes agreed), so the examples and the
documentation that quotes them cannot silently rot. Launches that import heavy libraries (transformers,
DeepSpeed) or shard models are marked slow.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BY_FEATURE = EXAMPLES / "by_feature"
# A loaded machine can take minutes for a launch that needs seconds of CPU; only a hang should fail.
LAUNCH_TIMEOUT = 900

pytestmark = pytest.mark.timeout(LAUNCH_TIMEOUT + 60)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TQDM_MININTERVAL="5", **extra)
    return env


def launch(
    script: Path, *args: str, cwd: Path, flags: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``script --tiny args`` on 2 CPU processes; return the parsed ``METRICS`` line."""
    argv = [
        sys.executable, "-m", "accelerando", "launch", "--cpu", "--num_processes", "2", *flags,
        str(script), "--tiny", *args,
    ]  # fmt: skip
    proc = subprocess.run(
        argv, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT
    )
    assert proc.returncode == 0, f"{script.name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("METRICS ")]
    # accelerator.print prints on the main process only: exactly one METRICS line.
    assert len(lines) == 1, proc.stdout[-3000:]
    return json.loads(lines[0][len("METRICS ") :])


# ------------------------------------------------------------------ structure (no launch)
ALL_EXAMPLES = sorted(
    p for p in [*EXAMPLES.glob("*.py"), *BY_FEATURE.glob("*.py")] if p.name != "quickstart.py"
)


@pytest.mark.parametrize("path", ALL_EXAMPLES, ids=lambda p: p.name)
def test_example_follows_the_house_style(path: Path) -> None:
    source = path.read_text()
    assert '"--tiny"' in source, "every example has a --tiny flag"
    assert "disable=not accelerator.is_local_main_process" in source, "progress bar on the main process only"
    assert '"METRICS "' in source, "prints its metrics as one METRICS line"
    assert "from accelerando import" in source, "uses the public API"
    assert source.startswith('"""'), "opens with a docstring saying how to run it"
    assert f"{path.relative_to(ROOT)}" in source, "its docstring shows the command that runs it"


def test_every_example_is_listed_with_its_command() -> None:
    table = (EXAMPLES / "README.md").read_text()
    for path in ALL_EXAMPLES:
        rel = str(path.relative_to(ROOT))
        assert re.search(rf"accelerando launch [^|`]*{re.escape(rel)}", table), (
            f"{rel} missing from examples/README.md"
        )


# ------------------------------------------------------------------ the two task examples
def test_cv_example(tmp_path: Path) -> None:
    m = launch(EXAMPLES / "cv_example.py", cwd=tmp_path)
    assert m["last_loss"] < m["first_loss"]
    assert m["accuracy"] > 0.4  # four classes: chance is 0.25
    assert m["eval_samples"] == 128


@pytest.mark.slow  # imports transformers in both processes
@pytest.mark.parametrize("model", ["bert", "llama"])
def test_nlp_example(tmp_path: Path, model: str) -> None:
    m = launch(EXAMPLES / "nlp_example.py", "--model", model, cwd=tmp_path)
    assert m["last_loss"] < m["first_loss"]
    assert m["accuracy"] > 0.75  # two classes
    assert m["eval_samples"] == 128


# ------------------------------------------------------------------ by feature
@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_checkpointing_resumes_bit_exactly(tmp_path: Path) -> None:
    script, project = BY_FEATURE / "checkpointing.py", str(tmp_path / "project")
    full = launch(script, "--checkpointing_steps", "5", "--project_dir", project, cwd=tmp_path)
    assert full["resumed_from"] is None and full["steps"] == 24
    # total_limit=3 kept the newest three of the checkpoints taken at steps 5, 10, 15, 20.
    assert full["checkpoints"] == ["checkpoint_1", "checkpoint_2", "checkpoint_3"]
    # Resume mid-epoch from step 10 (epoch 1, batch 2) and finish: the same weights as never stopping.
    resumed = launch(
        script,
        "--checkpointing_steps", "5", "--project_dir", project,
        "--resume_from_checkpoint", str(tmp_path / "project" / "checkpoints" / "checkpoint_1"),
        cwd=tmp_path,
    )  # fmt: skip
    assert resumed["resumed_from"] == "checkpoint_1"
    assert resumed["steps"] == 24
    assert resumed["weights_checksum"] == full["weights_checksum"]
    assert resumed["final_loss"] == full["final_loss"]


@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_tracking_writes_tensorboard_files(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    m = launch(BY_FEATURE / "tracking.py", "--project_dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert m["accuracy"] > 0.5
    assert "tracking_example/hparams.yml" in m["files"]
    events = [f for f in m["files"] if f.startswith("tracking_example/events.out.tfevents")]
    assert len(events) == 1  # the main process only
    assert os.path.getsize(tmp_path / "runs" / events[0]) > 0


@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_gradient_accumulation(tmp_path: Path) -> None:
    m = launch(BY_FEATURE / "gradient_accumulation.py", "--gradient_accumulation_steps", "4", cwd=tmp_path)
    # 320 samples / (8 per batch x 2 processes) = 20 batches per epoch, 3 epochs, a step every 4.
    assert m["batches"] == 60 and m["optimizer_steps"] == 15
    assert m["last_loss"] < m["first_loss"]


@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_automatic_gradient_accumulation(tmp_path: Path) -> None:
    m = launch(
        BY_FEATURE / "automatic_gradient_accumulation.py",
        "--observed_batch_size", "32", "--simulate_memory_for", "8",
        cwd=tmp_path,
    )  # fmt: skip
    assert m["tries"] == [[32, False], [16, False], [8, True]]
    assert m["batch_size"] == 8 and m["gradient_accumulation_steps"] == 4
    # 512 samples / (8 x 2 processes) = 32 batches per epoch, 2 epochs, a step every 4 batches.
    assert m["optimizer_steps"] == 16
    assert m["last_loss"] < m["first_loss"]


@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_memory_finds_the_largest_batch_and_records_memory(tmp_path: Path) -> None:
    m = launch(
        BY_FEATURE / "memory.py",
        "--simulate_memory_for",
        "40",
        "--project_dir",
        str(tmp_path / "p"),
        cwd=tmp_path,
    )
    assert m["batch_size"] == 40
    assert m["tries"] == [[64, False], [57, False], [51, False], [45, False], [40, True]]
    assert m["samples"] > 0 and m["peak_rss_mb"] > 0
    assert {"memory_rank0.json", "memory_rank1.json"} <= set(m["files"])
    assert m["last_loss"] < m["first_loss"]


def test_multi_process_metrics_counts_each_sample_once(tmp_path: Path) -> None:
    m = launch(BY_FEATURE / "multi_process_metrics.py", cwd=tmp_path)
    assert m["dataset_size"] == 101
    assert m["gather_samples"] > 101  # plain gather counts the evening-out repeats
    assert m["gather_for_metrics_samples"] == 101 and m["object_samples"] == 101
    assert m["accuracy"] > 0.5


@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_local_sgd_ends_in_sync(tmp_path: Path) -> None:
    m = launch(BY_FEATURE / "local_sgd.py", "--local_sgd_steps", "4", cwd=tmp_path)
    assert m["in_sync"] is True
    assert m["accuracy"] > 0.5


@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_early_stopping_stops_every_process_together(tmp_path: Path) -> None:
    m = launch(BY_FEATURE / "early_stopping.py", "--target_loss", "0.3", cwd=tmp_path)
    assert m["stopped_early"] is True
    assert m["stop_step"] < m["budget_steps"]
    assert m["stop_steps_per_process"] == [m["stop_step"], m["stop_step"]]
    assert m["trigger_loss"] is None or m["trigger_loss"] < 0.3


@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_profiler_writes_a_trace_per_process(tmp_path: Path) -> None:
    m = launch(BY_FEATURE / "profiler.py", "--trace_dir", str(tmp_path / "traces"), cwd=tmp_path)
    assert m["top_ops"]
    traces = m["traces"]
    # One Chrome trace per process, named after its rank.
    assert {name.split("_")[1] for name in traces} == {"0", "1"}, traces
    for name in traces:
        assert (tmp_path / "traces" / name).stat().st_size > 0


@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_big_model_inference_offloads_to_disk(tmp_path: Path) -> None:
    m = launch(BY_FEATURE / "big_model_inference.py", "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    assert m["placement"].get("disk", 0) > 0 and m["placement"].get("cpu", 0) > 0
    assert m["max_abs_diff"] < 1e-5  # the same weights, brought in by the offload hooks
    assert sum(m["answered_per_process"]) == 64
    assert "model.safetensors.index.json" in m["checkpoint_files"]
    assert (tmp_path / "out" / "offload_rank1").is_dir()


@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_distributed_inference_answers_each_input_once_in_order(tmp_path: Path) -> None:
    m = launch(BY_FEATURE / "distributed_inference.py", "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    assert m["inputs"] == 37 and m["results"] == 37 and m["in_order"] is True
    assert m["answered_per_process"] == [19, 19]  # padded to equal shares
    assert len((tmp_path / "out" / "predictions.jsonl").read_text().splitlines()) == 37


@pytest.mark.slow  # a 2-process launch; the default run keeps cv_example and multi_process_metrics
def test_schedule_free(tmp_path: Path) -> None:
    pytest.importorskip("schedulefree")
    m = launch(BY_FEATURE / "schedule_free.py", cwd=tmp_path)
    assert m["last_loss"] < m["first_loss"]
    assert m["accuracy"][-1] > 0.5


@pytest.mark.slow  # FSDP wrapping and collectives in two processes
def test_fsdp_shards_and_tracks_peak_memory(tmp_path: Path) -> None:
    m = launch(
        BY_FEATURE / "fsdp_with_peak_mem_tracking.py", "--project_dir", str(tmp_path / "p"), cwd=tmp_path
    )
    assert m["fsdp"].endswith("FSDP")
    assert m["held_params"] < m["total_params"]  # each process holds a shard
    assert m["state_dict_params"] == m["total_params"]  # gathered whole for saving
    assert m["peak_cpu_rss_mb"] > 0
    assert m["last_loss"] < m["first_loss"] and m["accuracy"] > 0.5


@pytest.mark.slow  # imports DeepSpeed in both processes
def test_deepspeed_with_config_file(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    config = BY_FEATURE / "deepspeed_config.json"
    m = launch(
        BY_FEATURE / "deepspeed_with_config_support.py",
        cwd=tmp_path,
        flags=("--use_deepspeed", "--deepspeed_config_file", str(config)),
        env=_env(DS_ACCELERATOR="cpu"),
    )
    assert m["zero_stage"] == 2
    assert m["micro_batch_size"] == 16 and m["train_batch_size"] == 32  # "auto" filled in by prepare
    assert m["optimizer_from_config"] is True
    assert m["last_loss"] < m["first_loss"] and m["accuracy"] > 0.5
