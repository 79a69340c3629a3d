"""get_launch_command builds `accelerando launch` command lines; ports, paths and flags for tests."""

from __future__ import annotations

import pytest

from accelerando.test_utils import testing


def test_get_launch_command_turns_kwargs_into_flags():
    command = testing.get_launch_command(
        num_processes=2, cpu=True, debug=False, mixed_precision=None, monitor_interval=0.1
    )
    assert command == ["accelerando", "launch", "--num_processes=2", "--cpu", "--monitor_interval=0.1"]


def test_get_launch_command_without_kwargs():
    assert testing.get_launch_command() == ["accelerando", "launch"]


def test_default_launch_command_uses_the_device_count():
    assert testing.DEFAULT_LAUNCH_COMMAND == [
        "accelerando",
        "launch",
        f"--num_processes={testing.device_count}",
        "--monitor_interval=0.1",
    ]


def test_every_launch_flag_name_is_accepted_by_accelerando_launch():
    from accelerando.commands import launch

    parser = launch.build_parser()
    args = launch.parse(
        parser, [*testing.get_launch_command(num_processes=2, monitor_interval=0.1)[2:], "x.py"]
    )
    assert int(args.num_processes) == 2 and float(args.monitor_interval) == 0.1


@pytest.mark.parametrize("worker, port", [(None, 29500), ("gw0", 29500), ("gw7", 29507)])
def test_get_torch_dist_unique_port(monkeypatch, worker, port):
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    assert testing.get_torch_dist_unique_port() == port


def test_pytest_xdist_worker_id_refuses_garbage(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "master")
    with pytest.raises(ValueError, match="gw"):
        testing.pytest_xdist_worker_id()


def test_path_in_accelerate_package_finds_the_bundled_scripts():
    for name in (
        "test_script.py",
        "test_ops.py",
        "test_sync.py",
        "test_distributed_data_loop.py",
        "test_cli.py",
    ):
        assert testing.path_in_accelerate_package("test_utils", "scripts", name).is_file(), name


def test_parse_flag_from_env(monkeypatch):
    monkeypatch.setenv("H3_FLAG", "true")
    assert testing.parse_flag_from_env("H3_FLAG") is True
    monkeypatch.delenv("H3_FLAG")
    assert testing.parse_flag_from_env("H3_FLAG", default=True) is True


def test_cpu_backend_answers():
    device, count, memory = testing.get_backend()
    assert (device, count) == (testing.torch_device, testing.device_count)
    if device == "cpu":
        assert count == 1 and memory() == 0


def test_launch_command_carries_the_stand_in(monkeypatch):
    import sys
    import types

    fake = types.SimpleNamespace(is_installed_as_accelerate=lambda: True)
    monkeypatch.setitem(sys.modules, "accelerando.core.stand_in", fake)
    assert testing.get_launch_command(num_processes=2) == [
        "accelerando",
        "launch",
        "--num_processes=2",
        "--install_as_accelerate",
    ]
    assert "--install_as_accelerate" not in testing.get_launch_command(install_as_accelerate=False)
