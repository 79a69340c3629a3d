"""Every command of ``examples/README.md`` runs exactly as written, from a fresh clone, and works.

The commands are read from the README's table and run as written (``accelerando`` is the command
installed beside this interpreter), with the working directory a fresh copy of ``examples/`` (the
repository root of a clone, as far as the examples can tell). Each example prints its results as one
``METRICS {json}`` line; the tests assert on those numbers (loss went down, accuracy above chance,
files written, processes agreed) and that nothing was written outside ``examples_output/``, so the
examples and the README that quotes them cannot silently rot: a command listed there that does not
work fails here. Launches that import heavy libraries (transformers, DeepSpeed) or shard models, and
the other 2-process launches, are marked slow; the default run keeps the shortest README command
(multi_process_metrics), which checks the README-as-written machinery on real processes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BY_FEATURE = EXAMPLES / "by_feature"
README = EXAMPLES / "README.md"
#: The one folder the examples write into by default (ignored by git).
OUTPUT = "examples_output"
# A loaded machine can take minutes for a launch that needs seconds of CPU; only a hang should fail.
LAUNCH_TIMEOUT = 900

pytestmark = pytest.mark.timeout(LAUNCH_TIMEOUT + 60)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TQDM_MININTERVAL="5", **extra)
    return env


def _metrics(proc: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("METRICS ")]
    # accelerator.print prints on the main process only: exactly one METRICS line.
    assert len(lines) == 1, proc.stdout[-3000:]
    return json.loads(lines[0][len("METRICS ") :])


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
    return _metrics(proc, script.name)


# ------------------------------------------------------------------ the README's commands
@dataclass(frozen=True)
class ReadmeCommand:
    """One row of the README's table: the example's path and the command shown for it."""

    script: str
    line: str

    @property
    def name(self) -> str:
        """The example's file name without ``.py`` (the test id, and its output folder's name)."""
        return Path(self.script).stem


def readme_commands() -> list[ReadmeCommand]:
    """The rows of the table in ``examples/README.md``: ``| `path` | what | `command` |``."""
    rows = []
    for line in README.read_text(encoding="utf-8").splitlines():
        script = re.match(r"^\| `(examples/[^`]+\.py)` \|", line)
        command = re.search(r"\| `([^`]+)` \|\s*$", line)
        if script and command:
            rows.append(ReadmeCommand(script.group(1), command.group(1)))
    return rows


def _accelerando() -> list[str]:
    """The installed ``accelerando`` command (the one beside this interpreter), else ``python -m``."""
    installed = shutil.which("accelerando", path=os.path.dirname(sys.executable))
    return [installed] if installed else [sys.executable, "-m", "accelerando"]


def run_readme_command(command: ReadmeCommand, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the README's command line as written, in ``cwd``: ``NAME=value`` words first set variables."""
    words = shlex.split(command.line)
    extra = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        extra[name] = value
    assert words[:2] == ["accelerando", "launch"], f"not an `accelerando launch` command: {command.line}"
    return subprocess.run(
        [*_accelerando(), *words[1:]],
        cwd=cwd,
        env=_env(**extra),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
    )


def fresh_clone(tmp_path: Path) -> Path:
    """A folder laid out as a fresh clone's root, as far as the examples see: a copy of ``examples/``."""
    root = tmp_path / "clone"
    shutil.copytree(EXAMPLES, root / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    return root


# What each example's README command must show. Each check gets the METRICS dict, the example's own
# output folder (``examples_output/<name>``) and the launch's stdout.
Check = Callable[[dict[str, Any], Path, str], None]


def _quickstart(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["accuracy"] > 0.75  # two spirals: chance is 0.5
    assert m["eval_samples"] == 1000
    assert m["optimizer_steps"] == 8 * 4096 // (32 * 2)  # 8 epochs, 32 per batch, 2 processes


def _cv(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["last_loss"] < m["first_loss"]
    assert m["accuracy"] > 0.4  # four classes: chance is 0.25
    assert m["eval_samples"] == 128


def _nlp(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["last_loss"] < m["first_loss"]
    assert m["accuracy"] > 0.75  # two classes
    assert m["eval_samples"] == 128


def _checkpointing(m: dict[str, Any], out: Path, stdout: str) -> None:
    # "latest" with no checkpoint yet (a fresh clone): one note, then a run from the beginning.
    assert "no checkpoint under" in stdout
    assert m["resumed_from"] is None and m["steps"] == 24
    # total_limit=3 kept the newest three of the checkpoints taken at steps 5, 10, 15, 20.
    assert m["checkpoints"] == ["checkpoint_1", "checkpoint_2", "checkpoint_3"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == m["checkpoints"]


def _tracking(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["accuracy"] > 0.5
    assert "tracking_example/hparams.yml" in m["files"]
    events = [f for f in m["files"] if f.startswith("tracking_example/events.out.tfevents")]
    assert len(events) == 1  # the main process only
    assert os.path.getsize(out / events[0]) > 0


def _gradient_accumulation(m: dict[str, Any], out: Path, stdout: str) -> None:
    # 320 samples / (8 per batch x 2 processes) = 20 batches per epoch, 3 epochs, a step every 4.
    assert m["batches"] == 60 and m["optimizer_steps"] == 15
    assert m["last_loss"] < m["first_loss"]


def _automatic_gradient_accumulation(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["tries"] == [[32, False], [16, False], [8, True]]
    assert m["batch_size"] == 8 and m["gradient_accumulation_steps"] == 4
    # 512 samples / (8 x 2 processes) = 32 batches per epoch, 2 epochs, a step every 4 batches.
    assert m["optimizer_steps"] == 16
    assert m["last_loss"] < m["first_loss"]


def _memory(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["batch_size"] == 40
    assert m["tries"] == [[64, False], [57, False], [51, False], [45, False], [40, True]]
    assert m["samples"] > 0 and m["peak_rss_mb"] > 0
    assert {"memory_rank0.json", "memory_rank1.json"} <= set(m["files"])
    assert (out / "memory" / "memory_rank0.json").is_file()
    assert m["last_loss"] < m["first_loss"]


def _multi_process_metrics(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["dataset_size"] == 101
    assert m["gather_samples"] > 101  # plain gather counts the evening-out repeats
    assert m["gather_for_metrics_samples"] == 101 and m["object_samples"] == 101
    assert m["accuracy"] > 0.5


def _local_sgd(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["in_sync"] is True
    assert m["accuracy"] > 0.5


def _early_stopping(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["stopped_early"] is True
    assert m["stop_step"] < m["budget_steps"]
    assert m["stop_steps_per_process"] == [m["stop_step"], m["stop_step"]]
    assert m["trigger_loss"] is None or m["trigger_loss"] < 0.3


def _profiler(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["top_ops"]
    traces = m["traces"]
    # One Chrome trace per process, named after its rank.
    assert {name.split("_")[1] for name in traces} == {"0", "1"}, traces
    for name in traces:
        assert (out / name).stat().st_size > 0


def _fsdp(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["fsdp"].endswith("FSDP")
    assert m["held_params"] < m["total_params"]  # each process holds a shard
    assert m["state_dict_params"] == m["total_params"]  # gathered whole for saving
    assert m["peak_cpu_rss_mb"] > 0
    assert m["last_loss"] < m["first_loss"] and m["accuracy"] > 0.5


def _deepspeed(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["zero_stage"] == 2
    assert m["micro_batch_size"] == 16 and m["train_batch_size"] == 32  # "auto" filled in by prepare
    assert m["optimizer_from_config"] is True
    assert m["last_loss"] < m["first_loss"] and m["accuracy"] > 0.5


def _big_model_inference(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["placement"].get("disk", 0) > 0 and m["placement"].get("cpu", 0) > 0
    assert m["max_abs_diff"] < 1e-5  # the same weights, brought in by the offload hooks
    assert sum(m["answered_per_process"]) == 64
    assert "model.safetensors.index.json" in m["checkpoint_files"]
    assert (out / "offload_rank1").is_dir()


def _distributed_inference(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["inputs"] == 37 and m["results"] == 37 and m["in_order"] is True
    assert m["answered_per_process"] == [19, 19]  # padded to equal shares
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 37


def _schedule_free(m: dict[str, Any], out: Path, stdout: str) -> None:
    assert m["last_loss"] < m["first_loss"]
    assert m["accuracy"][-1] > 0.5


@dataclass(frozen=True)
class Expect:
    """What one README command must show, the module it needs, and whether it is slow."""

    check: Check
    slow: bool = True
    needs: str | None = None


EXPECTED: dict[str, Expect] = {
    # 8 epochs on 2 processes, as the README shows it (no --tiny): end to end, with the slow gallery.
    "quickstart": Expect(_quickstart),
    "nlp_example": Expect(_nlp, needs="transformers"),  # imports transformers in both processes
    # A CNN on generated images, end to end; the default run keeps the metrics example (prepare,
    # backward, gather_for_metrics on 2 processes); the pieces are tested where they live.
    "cv_example": Expect(_cv),
    "checkpointing": Expect(_checkpointing),
    "tracking": Expect(_tracking, needs="tensorboard"),
    "gradient_accumulation": Expect(_gradient_accumulation),
    "automatic_gradient_accumulation": Expect(_automatic_gradient_accumulation),
    "memory": Expect(_memory),
    "multi_process_metrics": Expect(_multi_process_metrics, slow=False),
    "local_sgd": Expect(_local_sgd),
    "early_stopping": Expect(_early_stopping),
    "profiler": Expect(_profiler),
    "fsdp_with_peak_mem_tracking": Expect(_fsdp),  # FSDP wrapping and collectives in two processes
    "deepspeed_with_config_support": Expect(_deepspeed, needs="deepspeed"),  # imports DeepSpeed
    "big_model_inference": Expect(_big_model_inference),
    "distributed_inference": Expect(_distributed_inference),
    "schedule_free": Expect(_schedule_free, needs="schedulefree"),
}


def _readme_params() -> list[Any]:
    params = []
    for command in readme_commands():
        expect = EXPECTED.get(command.name)
        slow = expect is None or expect.slow
        params.append(pytest.param(command, id=command.name, marks=[pytest.mark.slow] if slow else []))
    return params


@pytest.mark.parametrize("command", _readme_params())
def test_readme_command_runs_as_written(
    command: ReadmeCommand, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    expect = EXPECTED.get(command.name)
    assert expect is not None, f"examples/README.md lists {command.script}, which has no checks here"
    if expect.needs:
        pytest.importorskip(expect.needs)
    if expect.needs == "deepspeed":
        try:  # built once per session, where the suite provides it (else each process compiles it)
            request.getfixturevalue("deepspeed_cpu_op")
        except pytest.FixtureLookupError:
            pass
    clone = fresh_clone(tmp_path)
    proc = run_readme_command(command, clone)
    m = _metrics(proc, command.line)
    # Everything the example wrote is under the one ignored output folder, in its own subfolder.
    assert sorted(p.name for p in clone.iterdir()) in (["examples"], ["examples", OUTPUT]), sorted(
        p.name for p in clone.iterdir()
    )
    written = sorted(p.name for p in (clone / OUTPUT).iterdir()) if (clone / OUTPUT).exists() else []
    assert set(written) <= {command.name}, written
    expect.check(m, clone / OUTPUT / command.name, proc.stdout)


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
    listed = {command.script: command.line for command in readme_commands()}
    for path in [EXAMPLES / "quickstart.py", *ALL_EXAMPLES]:
        rel = str(path.relative_to(ROOT))
        assert rel in listed, f"{rel} missing from examples/README.md"
        assert re.search(rf"accelerando launch [^|`]*{re.escape(rel)}", listed[rel]), listed[rel]
    assert set(listed) == {str(p.relative_to(ROOT)) for p in [EXAMPLES / "quickstart.py", *ALL_EXAMPLES]}


def test_every_readme_command_is_checked() -> None:
    names = [command.name for command in readme_commands()]
    assert len(names) == len(set(names)), "one README row per example"
    assert set(names) == set(EXPECTED), "EXPECTED (the checks) and the README's table list the same examples"


def test_default_outputs_go_to_the_ignored_folder() -> None:
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert f"/{OUTPUT}/" in ignored
    found = 0
    for path in [EXAMPLES / "quickstart.py", *ALL_EXAMPLES]:
        for default in re.findall(r'"--(?:project|output|trace)_dir", default="([^"]+)"', path.read_text()):
            assert default == f"{OUTPUT}/{path.stem}", f"{path.name}: default {default!r}"
            found += 1
    assert found >= 8, "the examples that write files take their folder from one of these flags"


# ------------------------------------------------------------------ beyond the README's commands
@pytest.mark.slow  # imports transformers in both processes
def test_nlp_example_with_llama(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _nlp(launch(EXAMPLES / "nlp_example.py", "--model", "llama", cwd=tmp_path), tmp_path, "")


@pytest.mark.slow  # two 2-process launches
def test_checkpointing_resumes_bit_exactly(tmp_path: Path) -> None:
    script, project = BY_FEATURE / "checkpointing.py", str(tmp_path / "project")
    full = launch(script, "--checkpointing_steps", "5", "--project_dir", project, cwd=tmp_path)
    assert full["resumed_from"] is None and full["steps"] == 24
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
    # "latest" now finds the newest checkpoint (step 20) and finishes the last 4 steps from it.
    latest = launch(
        script, "--checkpointing_steps", "5", "--project_dir", project, "--resume_from_checkpoint", "latest",
        cwd=tmp_path,
    )  # fmt: skip
    assert latest["resumed_from"] == resumed["checkpoints"][-1] and latest["steps"] == 24
    assert latest["weights_checksum"] == full["weights_checksum"]
