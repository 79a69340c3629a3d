"""`accelerando launch --ray` and `--emit ray` without a cluster: flags, ranks, job file, Ray left unloaded.

The runs on a real local Ray cluster are in test_ray_cluster.py (slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelerando.commands.launch.flags import split_unknown
from accelerando.commands.launch.parser import build_parser, parse
from accelerando.core.environments import RayTrainEnvironment, detect_environment
from accelerando.core.settings import Sourced, resolve
from accelerando.launchers.emit import emit_job
from accelerando.launchers.plan import Command
from accelerando.launchers.ray import Failure, failure_summary, process_env, rank_by_machine


def _settings(**values):
    return resolve([{k: Sourced(v, f"cli:--{k}") for k, v in values.items()}])


# --- the flag --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "ray", "script", "script_args"),
    [
        (["--ray", "train.py", "--lr", "1"], "default", "train.py", ["--lr", "1"]),
        (["--ray", "10.0.0.1:6379", "train.py"], "10.0.0.1:6379", "train.py", []),
        (["--ray", "ray://head:10001", "--cpu", "t.py"], "ray://head:10001", "t.py", []),
        (["--ray", "auto", "t.py"], "auto", "t.py", []),
        (["--ray=local", "t.py"], "local", "t.py", []),
        (["--ray", "--cpu", "t.py"], "default", "t.py", []),
        (["--cpu", "t.py"], None, "t.py", []),
    ],
)
def test_ray_takes_an_optional_address_and_never_eats_the_script(argv, ray, script, script_args) -> None:
    args = parse(build_parser(), argv)
    assert (args.ray, args.training_script, list(args.training_script_args)) == (ray, script, script_args)
    assert not args.unknown_args


def test_ray_is_a_setting_with_its_variable_and_config_key(monkeypatch, isolated_env, tmp_path) -> None:
    from accelerando.commands.launch.resolution import resolve_launch_settings

    monkeypatch.setenv("ACCELERANDO_RAY", "10.0.0.9:6379")
    args = parse(build_parser(), ["--config_file", str(tmp_path / "none.yaml"), "t.py"])
    (tmp_path / "none.yaml").write_text("ray: 10.0.0.8:6379\n")
    settings, _ = resolve_launch_settings(args)
    assert (settings.ray, settings.source("ray")) == ("10.0.0.9:6379", "env:ACCELERANDO_RAY")
    args = parse(build_parser(), ["--config_file", str(tmp_path / "none.yaml"), "--ray", "t.py"])
    settings, _ = resolve_launch_settings(args)
    assert (settings.ray, settings.source("ray")) == ("default", "cli:--ray")


def test_the_head_tokens_end_at_the_script_after_a_bare_ray_flag() -> None:
    assert split_unknown(["--ray", "x.py", "--ray"]) == (["--ray"], ["x.py", "--ray"])
    assert split_unknown(["--ray", "h:1", "x.py"]) == (["--ray", "h:1"], ["x.py"])


# --- ranks and variables -----------------------------------------------------------------------------


@given(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=12))
def test_ranks_are_consecutive_per_machine_and_cover_every_process(nodes) -> None:
    places = [(f"10.0.0.{ord(n)}", n) for n in nodes]
    ranks = rank_by_machine(places)
    assert sorted(r for r, *_ in ranks) == list(range(len(nodes)))
    first_seen = list(dict.fromkeys(nodes))
    for (rank, local, node_rank, local_size), (_ip, node) in zip(ranks, places, strict=True):
        assert node_rank == first_seen.index(node)
        assert local_size == nodes.count(node)
        assert 0 <= local < local_size
        # the ranks of one machine are one run, in machine order
        before = sum(nodes.count(n) for n in first_seen[:node_rank])
        assert rank == before + local


def test_each_process_gets_a_torchrun_processes_variables() -> None:
    env = process_env({"ACCELERANDO_CPU": "true"}, rank=3, local_rank=1, node_rank=1, local_world_size=2,
                      world_size=4, num_machines=2, address="10.0.0.2", port=1234, attempt=2,
                      max_restarts=3)  # fmt: skip
    assert env["ACCELERANDO_CPU"] == "true"
    from accelerando.core.environments import TorchElasticEnvironment

    cluster = detect_environment(env)
    assert isinstance(cluster, TorchElasticEnvironment)
    assert (cluster.rank, cluster.local_rank, cluster.node_rank, cluster.world_size) == (3, 1, 1, 4)
    assert (cluster.main_address, cluster.main_port, cluster.restart_count) == ("10.0.0.2", 1234, 2)


def test_the_failure_summary_blames_a_kill_before_its_victims() -> None:
    killed = Failure(rank=1, node_ip="10.0.0.2", pid=7, code=-9, seen=3)
    victim = Failure(rank=0, node_ip="10.0.0.1", pid=6, code=1, seen=3)
    stopped = Failure(rank=2, node_ip="10.0.0.1", pid=8, code=-15, seen=4)
    ordered = sorted([stopped, victim, killed], key=Failure.blame_order)
    assert ordered == [killed, victim, stopped]
    line = failure_summary(ordered)
    assert line.startswith(
        "accelerando launch: process 1 (on 10.0.0.2, pid 7) was killed by signal 9 (SIGKILL)"
    )
    assert "process 0 failed with exit code 1" in line and "3 process(es) failed in all" in line
    assert [f.exit_status for f in ordered] == [137, 1, 143]
    lost = Failure(rank=0, node_ip="x", pid=None, code=-9, seen=1, lost=True)
    assert "lost its Ray worker" in lost.describe()


# --- the Ray Train environment -----------------------------------------------------------------------


class _Context:
    def get_world_size(self) -> int:
        return 4

    def get_world_rank(self) -> int:
        return 2

    def get_local_rank(self) -> int:
        return 0

    def get_local_world_size(self) -> int:
        return 2

    def get_node_rank(self) -> int:
        return 1


def test_a_ray_train_worker_reads_its_place_from_rays_context() -> None:
    cluster = RayTrainEnvironment({"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "4242"}, context=_Context())
    assert (cluster.world_size, cluster.rank, cluster.local_rank, cluster.node_rank) == (4, 2, 0, 1)
    assert (cluster.local_world_size, cluster.main_address, cluster.main_port) == (2, "10.0.0.5", 4242)
    assert cluster.restart_count == 0 and cluster.name == "ray_train"


def test_outside_ray_train_the_environment_is_not_detected_and_ray_is_not_imported() -> None:
    code = (
        "import json, sys\n"
        "from accelerando.core.environments import detect_environment\n"
        "env = detect_environment({'RANK': '0', 'WORLD_SIZE': '2', 'MASTER_ADDR': 'h', 'MASTER_PORT': '1'})\n"
        "print(json.dumps([env.name, 'ray' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["torchrun", False]


def test_import_help_and_emit_load_no_ray(tmp_path: Path) -> None:
    code = (
        "import json, subprocess, sys\n"
        "import accelerando\n"
        "from accelerando.commands.cli import main\n"
        "job = sys.argv[-1]\n"
        "for argv in (['accelerando', '--help'], ['accelerando', 'launch', '--help']):\n"
        "    sys.argv = argv\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "sys.argv = ['accelerando', 'launch', '--emit', 'ray', '--emit_to', job, '--cpu', 't.py']\n"
        "assert main() == 0\n"
        "print('\\n' + json.dumps([m for m in ('ray', 'torchft') if m in sys.modules]))\n"
    )
    env = {**os.environ, "ACCELERANDO_CONFIG_FILE": os.devnull}
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "job.sh")], capture_output=True,
                            text=True, env=env, check=True)  # fmt: skip
    assert json.loads(result.stdout.splitlines()[-1]) == []
    assert "--ray [ADDRESS]" in result.stdout
    assert (tmp_path / "job.sh").read_text().startswith("#!/bin/bash")


# --- --emit ray --------------------------------------------------------------------------------------


def test_emit_ray_writes_a_job_entrypoint_that_launches_with_every_setting(tmp_path: Path) -> None:
    settings = _settings(emit="ray", ray="10.0.0.1:6379", cpu=True, num_processes=4, max_restarts=2,
                         auto_resume=True, mixed_precision="bf16")  # fmt: skip
    text = emit_job(settings, Command("train.py", ("--name", "a b", "it's")))
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert any(line.startswith("#   ray job submit --address http://") for line in lines)
    launch = lines[-1]
    assert launch.startswith("exec accelerando launch --ray --num_processes 4 ")
    for flag in ("--cpu", "--auto_resume", "--max_restarts 2", "--mixed_precision bf16"):
        assert flag in launch
    assert "10.0.0.1:6379" not in text  # the job uses the cluster it is submitted to
    # bash reads back the script's arguments byte for byte
    echo = launch.replace("exec accelerando launch", "printf '%s\\n'", 1)
    out = subprocess.run(["bash", "-c", echo], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[-3:] == ["--name", "a b", "it's"] and out[-4] == "train.py"
    # the job's own launch line parses as a --ray launch of the same script
    args = parse(build_parser(), out)
    assert (args.ray, args.num_processes, args.training_script) == ("default", 4, "train.py")


def test_emit_ray_refuses_a_nul_byte_in_an_argument() -> None:
    with pytest.raises(ValueError, match="NUL"):
        emit_job(_settings(emit="ray", cpu=True), Command("train.py", ("a\x00b",)))


def test_ray_refuses_settings_that_place_the_processes_another_way() -> None:
    from accelerando.launchers.ray import check_ray_settings

    check_ray_settings(_settings(ray="default", cpu=True))
    for name, value in (("fault_tolerance", True), ("mpirun_hostfile", "hosts.txt")):
        with pytest.raises(
            ValueError, match=rf"--ray \(cli:--ray\) and {name} \(cli:--{name}.*Fix: choose one"
        ):
            check_ray_settings(_settings(ray="default", **{name: value}))
