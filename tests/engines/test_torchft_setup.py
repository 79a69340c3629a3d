"""Fault tolerance (torchft) without processes: settings, launch plan, connector rule, plugin, imports.

Run: ``python -m pytest -q tests/engines/test_torchft_setup.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from accelerando.backends.connector import decide
from accelerando.commands.launch.parser import build_parser, parse
from accelerando.commands.launch.resolution import plan_for
from accelerando.core.enums import DistributedType
from accelerando.launchers import ft
from accelerando.parallelism_config import ParallelismConfig
from accelerando.plugins.fault_tolerance import FaultTolerancePlugin


def _plan(tmp_path: Path, *flags: str) -> ft.FaultTolerantPlan:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    args = parse(build_parser(), ["--fault_tolerance", *flags, str(script)])
    settings, first = plan_for(args)
    return ft.build(settings, first, lambda: plan_for(args)[1])


@pytest.mark.usefixtures("isolated_env")
def test_launch_plan_starts_one_job_per_replica_group(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "--ft_replica_groups", "3", "--max_restarts", "2", "--ft_heartbeat_timeout", "1.5")
    assert [g.replica_id for g in plan.groups] == [0, 1, 2]
    assert [g.plan.env["ACCELERANDO_FT_REPLICA_ID"] for g in plan.groups] == ["0", "1", "2"]
    assert all(g.plan.env["ACCELERANDO_FAULT_TOLERANCE"] in ("1", "true", "True") for g in plan.groups)
    assert (plan.lighthouse, plan.max_restarts, plan.heartbeat_timeout_s, plan.min_replicas) == (
        None,
        2,
        1.5,
        1,
    )
    assert "3 replica group(s), lighthouse started on this machine" in plan.describe()


@pytest.mark.usefixtures("isolated_env")
def test_a_given_lighthouse_reaches_every_group_and_defaults_hold(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path, "--ft_lighthouse", "http://lh:29510", "--bind_address", "10.0.0.5", "--ft_insecure"
    )
    assert len(plan.groups) == ft.DEFAULT_REPLICA_GROUPS
    assert {g.plan.env["ACCELERANDO_FT_LIGHTHOUSE"] for g in plan.groups} == {"http://lh:29510"}
    assert plan.heartbeat_timeout_s == ft.DEFAULT_HEARTBEAT_TIMEOUT_S


@pytest.mark.usefixtures("isolated_env")
def test_impossible_plans_are_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exceeds the 2 replica group"):
        _plan(tmp_path, "--ft_min_replicas", "3")
    with pytest.raises(ValueError, match="--num_machines 1"):
        _plan(tmp_path, "--num_machines", "2", "--machine_rank", "0", "--main_process_ip", "10.0.0.1")


def _decide(**kw: object) -> object:
    base = dict(
        num_processes=1,
        process_type=DistributedType.NO,
        deepspeed_requested=False,
        fsdp_requested=False,
        megatron_requested=False,
        requested_type=None,
        fault_tolerance_requested=True,
    )
    return decide(**{**base, **kw})


def test_connector_picks_the_fault_tolerant_strategy_and_refuses_mixtures() -> None:
    decision = _decide()
    assert (decision.strategy_name, decision.distributed_type) == ("fault_tolerant", DistributedType.NO)
    assert _decide(parallelism=ParallelismConfig(dp_replicate_size=2)).strategy_name == "fault_tolerant"
    with pytest.raises(ValueError, match="drop the other backend"):
        _decide(deepspeed_requested=True)
    with pytest.raises(ValueError, match="drop the other backend"):
        _decide(fsdp_requested=True)  # FSDP without dp_shard_size: not HSDP
    hsdp = _decide(fsdp_requested=True, parallelism=ParallelismConfig(dp_shard_size=2))
    assert hsdp.strategy_name == "fault_tolerant"
    assert _decide(parallelism=ParallelismConfig(dp_shard_size=2)).strategy_name == "fault_tolerant"  # HSDP
    with pytest.raises(ValueError, match="keep only dp_replicate_size and dp_shard_size"):
        _decide(parallelism=ParallelismConfig(dp_shard_size=2, tp_size=2))


@pytest.mark.usefixtures("isolated_env")
def test_plugin_fills_from_the_launch_and_checks_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando.core.settings import forget_process_settings

    monkeypatch.setenv("ACCELERANDO_FT_REPLICA_ID", "1")
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://lh:1")
    forget_process_settings()
    plugin = FaultTolerancePlugin(min_replicas=2)
    assert (plugin.replica_id, plugin.lighthouse, plugin.min_replicas) == (1, "http://lh:1", 2)
    forget_process_settings()
    for bad in ({"min_replicas": 0}, {"timeout": 0}, {"replica_id": -1}):
        with pytest.raises(ValueError, match="FaultTolerancePlugin"):
            FaultTolerancePlugin(**bad)


@pytest.mark.usefixtures("isolated_env")
def test_a_process_without_lighthouse_or_replica_id_is_told_how_to_launch() -> None:
    pytest.importorskip("torchft")
    from accelerando.backends.strategies.fault_tolerance.manager import start_manager

    with pytest.raises(ValueError, match="accelerando launch --fault_tolerance"):
        start_manager(FaultTolerancePlugin(replica_id=0), 0, 1)
    with pytest.raises(ValueError, match="replica group number"):
        start_manager(FaultTolerancePlugin(lighthouse="http://lh:1"), 0, 1)


_PROBE = """
import json, sys, io, contextlib
import accelerando
from accelerando import FaultTolerancePlugin
import accelerando.launchers.ft, accelerando.backends.strategies
from accelerando.commands.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(["launch", "--help"])
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "torchft")))
"""


def test_import_and_help_load_no_torchft() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _group(replica_id: int, code: str) -> ft.ReplicaGroup:
    from accelerando.launchers.plan import LaunchPlan

    plan = LaunchPlan("simple", (sys.executable, "-c", code), {}, 1, 1, 1, 0)
    return ft.ReplicaGroup(replica_id, plan)


# Appends an "x" to the file, then exits with FIRST_EXIT the first time and 0 afterwards.
_COUNTS_STARTS = (
    "import os, sys; p = {path!r}; first = not os.path.exists(p); open(p, 'a').write('x'); "
    "sys.exit({first_exit} if first else 0)"
)


def test_a_failed_group_restarts_alone_and_the_launch_succeeds(tmp_path: Path) -> None:
    steady, flaky = tmp_path / "steady", tmp_path / "flaky"
    groups = (
        _group(0, _COUNTS_STARTS.format(path=str(steady), first_exit=0)),
        _group(1, _COUNTS_STARTS.format(path=str(flaky), first_exit=3)),
    )
    plan = ft.FaultTolerantPlan(groups, "http://given:1", 1, 1.0, max_restarts=1, monitor_interval_s=0.01)
    assert ft.run(plan, quiet=True) == 0
    assert (steady.read_text(), flaky.read_text()) == ("x", "xx")  # group 0 started once, group 1 twice


def test_a_group_out_of_restarts_fails_the_launch_with_its_status(tmp_path: Path) -> None:
    groups = (_group(0, "pass"), _group(1, "import sys; sys.exit(5)"))
    plan = ft.FaultTolerantPlan(groups, "http://given:1", 1, 1.0, max_restarts=1, monitor_interval_s=0.01)
    assert ft.run(plan, quiet=True) == 5


@pytest.mark.usefixtures("isolated_env")
def test_config_file_section_sets_fault_tolerance(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "fault_tolerance_config:\n  fault_tolerance: true\n  ft_replica_groups: 3\n  ft_min_replicas: 2\n"
    )
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    args = parse(build_parser(), ["--config_file", str(config), str(script)])
    settings, first = plan_for(args)
    assert settings.fault_tolerance and settings.source("ft_replica_groups").startswith("config:")
    plan = ft.build(settings, first, lambda: plan_for(args)[1])
    assert (len(plan.groups), plan.min_replicas) == (3, 2)


# Marks its start in the file, then waits; SIGTERM makes it exit 143 (as a preempted, checkpointed run).
_WAITS_FOR_SIGTERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); "
    "open({path!r}, 'a').write('x'); time.sleep(120)"
)
_LAUNCHER = """
import sys
from accelerando.launchers import ft
from accelerando.launchers.plan import LaunchPlan
groups = tuple(ft.ReplicaGroup(i, LaunchPlan("simple", (sys.executable, "-c", code), {{}}, 1, 1, 1, 0))
               for i, code in enumerate({codes!r}))
sys.exit(ft.run(ft.FaultTolerantPlan(groups, "http://given:1", 1, 1.0, max_restarts=3, monitor_interval_s=0.01)))
"""


def test_sigterm_reaches_every_group_and_ends_restarts(tmp_path: Path) -> None:
    import signal
    import time

    marks = [tmp_path / f"started{i}" for i in (0, 1)]
    codes = [_WAITS_FOR_SIGTERM.format(path=str(mark)) for mark in marks]
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER.format(codes=codes)])
    deadline = time.monotonic() + 240
    while not all(mark.exists() for mark in marks):
        assert launcher.poll() is None and time.monotonic() < deadline, "the groups did not start"
        time.sleep(0.05)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=120) == 143
    assert [mark.read_text() for mark in marks] == ["x", "x"]  # each group started once: no restart
