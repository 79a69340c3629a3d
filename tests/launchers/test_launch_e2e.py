"""End-to-end launches of a real script with 1 and 2 CPU processes, through the CLI and `python -m`.

The probe script reports, per rank, what the process sees: rank, world size, device, and the
mixed precision / accumulation steps resolved by the same resolver the Accelerator uses, with the
source of each. Each launch checks several ways of setting values at once to keep launches few.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """\
import json, os, sys
import torch
from accelerando.core.settings import resolve_runtime_settings
from accelerando.state import PartialState

out, code = sys.argv[1], json.loads(sys.argv[2])
state = PartialState()
settings = resolve_runtime_settings(code)
total = torch.tensor([state.process_index + 1.0])
if state.use_distributed:
    torch.distributed.all_reduce(total)
report = {
    "rank": state.process_index, "world": state.num_processes, "local_rank": state.local_process_index,
    "device": str(state.device), "sum": float(total), "args": sys.argv[3:],
    "mixed_precision": [settings.mixed_precision, settings.source("mixed_precision")],
    "gas": [settings.gradient_accumulation_steps, settings.source("gradient_accumulation_steps")],
    "origins": {n: settings.origin(n) for n in ("mixed_precision", "gradient_accumulation_steps", "cpu")},
    "omp": os.environ.get("OMP_NUM_THREADS"),
}
with open(os.path.join(out, f"rank{state.process_index}.json"), "w") as f:
    json.dump(report, f)
if state.use_distributed:  # leaving gloo up at exit can abort the process (reported to the state owner)
    torch.distributed.destroy_process_group()
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def env(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    clean.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))
    clean.pop("OMP_NUM_THREADS", None)
    return clean


@pytest.fixture
def probe(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    (tmp_path / "out").mkdir()
    return path


def cli() -> list[str]:
    exe = shutil.which("accelerando")
    return [exe] if exe else [sys.executable, "-m", "accelerando.commands.cli"]


def launch(prefix, flags, probe, code, env, extra=(), timeout=120):
    out = probe.parent / "out"
    for old in out.glob("*.json"):
        old.unlink()
    argv = [*prefix, *flags, str(probe), str(out), json.dumps(code), *extra]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return result, reports


def test_cli_two_processes_flag_beats_env_and_config_code_beats_all(probe, env, tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("mixed_precision: 'no'\ngradient_accumulation_steps: 5\nnum_processes: 1\n")
    env = {**env, "ACCELERATE_MIXED_PRECISION": "fp16", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}
    flags = ["launch", "--config_file", str(config), "--cpu", "--num_processes", "2",
             "--mixed_precision", "bf16", "--gradient_accumulation_steps", "2"]  # fmt: skip
    result, reports = launch(cli(), flags, probe, {"gradient_accumulation_steps": 8}, env, ["--lr", "0.1"])
    assert result.returncode == 0, result.stderr
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        assert r["world"] == 2 and r["local_rank"] == r["rank"] and r["device"] == "cpu"
        assert r["sum"] == 3.0  # the processes really talk to each other
        assert r["args"] == ["--lr", "0.1"]
        assert r["mixed_precision"] == ["bf16", "env:ACCELERANDO_MIXED_PRECISION"]  # the flag, carried
        assert r["gas"] == [8, "code"]
        assert r["omp"] is not None
    assert reports[0]["origins"]["mixed_precision"] == "cli:--mixed_precision"
    assert reports[0]["origins"]["cpu"] == "cli:--cpu"
    assert (
        "gradient_accumulation_steps=8 from code overrides 2 from env:ACCELERANDO_GRADIENT_ACCUMULATION_STEPS "
        "(the launcher's cli:--gradient_accumulation_steps)" in result.stderr
    )
    assert result.stderr.count("overrides") == 1  # rank 0 warns, the other ranks stay quiet


def test_python_m_two_processes_from_config_with_env_override(probe, env, tmp_path):
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"distributed_type": "MULTI_CPU", "use_cpu": True, "num_processes": 2,
                                  "mixed_precision": "bf16", "gradient_accumulation_steps": 4}))  # fmt: skip
    env = {**env, "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "3"}
    prefix = [sys.executable, "-m", "accelerando.commands.launch", "--config_file", str(config)]
    result, reports = launch(prefix, [], probe, {}, env)
    assert result.returncode == 0, result.stderr
    assert [(r["rank"], r["world"]) for r in reports] == [(0, 2), (1, 2)]
    for r in reports:
        assert r["mixed_precision"] == ["bf16", "env:ACCELERANDO_MIXED_PRECISION"]
        assert r["gas"] == [3, "env:ACCELERANDO_GRADIENT_ACCUMULATION_STEPS"]
        assert r["origins"]["mixed_precision"] == f"config:{config}"  # provenance survives the hand-over
        assert r["origins"]["gradient_accumulation_steps"] == "env:ACCELERATE_GRADIENT_ACCUMULATION_STEPS"


def test_one_process_defaults_env_and_exit_status(probe, env):
    env = {**env, "ACCELERATE_MIXED_PRECISION": "bf16", "PROBE_EXIT": "3"}
    result, reports = launch(cli(), ["launch"], probe, {"mixed_precision": "no"}, env, ["--help", "-q"])
    assert result.returncode == 3  # the script's exit status
    (r,) = reports
    assert (r["rank"], r["world"], r["device"]) == (0, 1, "cpu")
    assert r["args"] == ["--help", "-q"]  # script args untouched
    assert r["gas"] == [1, "default"]
    assert r["mixed_precision"] == ["no", "code"]  # code beats the env var
    assert (
        "mixed_precision='no' from code overrides 'bf16' from env:ACCELERANDO_MIXED_PRECISION"
        in result.stderr
    )


def test_failed_process_reports_once_and_sets_exit_status(env, tmp_path):
    script = tmp_path / "fail.py"  # no torch in the processes: this launch checks the agent path only
    script.write_text(
        "import os\nif os.environ['RANK'] == '1':\n    raise RuntimeError('probe failure on rank 1')\n"
    )
    result = subprocess.run([*cli(), "launch", "--cpu", "--num_processes", "2", str(script)], env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.count("RuntimeError: probe failure on rank 1") == 1
    assert result.stderr.count("Traceback (most recent call last)") == 1
    assert "process 1 (local rank 1" in result.stderr and "failed with exit code 1" in result.stderr


def test_module_launch(env, tmp_path):
    pkg = tmp_path / "probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hello.py").write_text(
        "import os, sys\nprint('MODULE', os.environ['ACCELERANDO_NUM_PROCESSES'], sys.argv[1:])\n"
    )
    env = {**env, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [*cli(), "launch", "-m", "probe_pkg.hello", "a", "--b"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "MODULE 1 ['a', '--b']" in result.stdout
    assert Path(tmp_path).exists()
