"""Hostile and faulty settings: each bad input -> a short error naming the problem, its source and the fix."""

from __future__ import annotations

import os
import stat

import pytest

from accelerando.commands import launch
from accelerando.core.settings import Sourced, resolve
from accelerando.core.settings.configfile import ConfigError, load_config_layer
from accelerando.core.settings.fields import get_field, quote_value
from accelerando.core.settings.resolve import parse_value, resolve_runtime_settings

HUGE = "x" * 50_000_000  # 50 MB: must never be echoed whole
MAX_MESSAGE = 1_000  # no message here needs more characters than this


@pytest.fixture(autouse=True)
def clean_env(isolated_env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('ran')\n")


def _file(name: str, content: bytes | str) -> str:
    data = content.encode() if isinstance(content, str) else content
    with open(name, "wb") as handle:
        handle.write(data)
    return name


def _not_executable() -> str:
    path = _file("tool.sh", "#!/bin/sh\necho hi\n")
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    return "./" + path


# (id, argv builder run inside tmp_path, message fragments); every case ends with exit status 2.
LAUNCH_CASES = [
    (
        "binary config file",
        lambda: ["--config_file", _file("x.bin", b"\x00\x01\xff\xfe\x80binary"), "train.py"],
        ["x.bin", "is not a text YAML/JSON config", "Fix:"],
    ),
    (
        "config file with NUL bytes",
        lambda: ["--config_file", _file("nul.yaml", b"\x00" * 64), "train.py"],
        ["nul.yaml", "is not a text YAML/JSON config", "Fix:"],
    ),
    (
        "config path that is a folder",
        lambda: ["--config_file", (os.mkdir("folder.yaml") or "folder.yaml"), "train.py"],
        ["folder.yaml"],
    ),
    (
        "50 MB value in a CLI flag",
        lambda: ["--mixed_precision", HUGE, "--dry-run", "train.py"],
        ["cli:--mixed_precision", "'" + "x" * 40 + "'... (50000000 characters)", "Fix:"],
    ),
    (
        "5 MB value in a config file",
        lambda: ["--config_file", _file("big.yaml", "mixed_precision: " + "z" * 5_000_000), "train.py"],
        ["big.yaml", "'" + "z" * 40 + "'... (5000000 characters)", "mixed_precision"],
    ),
    (
        "5 MB unknown key in a JSON config file",
        lambda: ["--config_file", _file("key.json", '{"' + "k" * 5_000_000 + '": 1}'), "train.py"],
        ["unknown key", "... (5000000 characters)"],
    ),
    (
        "50 MB unknown launcher flag",
        lambda: ["--" + HUGE, "train.py"],
        ["unknown flag", "... (50000002 characters)"],
    ),
    (
        "port 99999 in a config file",
        lambda: ["--config_file", _file("port.yaml", "main_process_port: 99999\n"), "--dry-run", "train.py"],
        ["99999", "main_process_port", "config:port.yaml", "from 0 to 65535"],
    ),
    (
        "port 65536 as a CLI flag",
        lambda: ["--main_process_port", "65536", "--dry-run", "train.py"],
        ["65536", "cli:--main_process_port", "from 0 to 65535"],
    ),
    (
        "negative port",
        lambda: ["--main_process_port", "-1", "--dry-run", "train.py"],
        ["-1", "from 0 to 65535"],
    ),
    (
        "NaN for a number setting",
        lambda: ["--config_file", _file("nan.yaml", "monitor_interval: .nan\n"), "--dry-run", "train.py"],
        ["monitor_interval", "nan.yaml", "a number >= 0"],
    ),
    (
        "--no_python with a program not on PATH",
        lambda: ["--no_python", "--dry-run", "no-such-program-xyz", "--flag"],
        ["'no-such-program-xyz'", "not found on PATH", "Fix:"],
    ),
    (
        "--no_python with a file that is not executable",
        lambda: ["--no_python", "--cpu", "--num_processes", "2", _not_executable()],
        ["'./tool.sh'", "not an executable file", "chmod +x"],
    ),
]


@pytest.mark.parametrize("argv, fragments", [c[1:] for c in LAUNCH_CASES], ids=[c[0] for c in LAUNCH_CASES])
def test_launch_refuses_with_a_short_clear_message(argv, fragments, capsys):
    status = launch.main(argv())
    err = capsys.readouterr().err
    assert status == 2, err[:MAX_MESSAGE]
    assert "Traceback" not in err
    assert len(err) < MAX_MESSAGE, err[:MAX_MESSAGE]
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_the_env_layer_quotes_a_50_mb_value_briefly(monkeypatch):
    monkeypatch.setenv("ACCELERANDO_MIXED_PRECISION", HUGE)
    with pytest.raises(ValueError) as info:
        resolve_runtime_settings(environ=dict(os.environ))
    message = str(info.value)
    assert len(message) < MAX_MESSAGE
    assert "env:ACCELERANDO_MIXED_PRECISION" in message and "(50000000 characters)" in message
    assert "unset that variable" in message


def test_the_env_layer_refuses_an_out_of_range_port(monkeypatch, capsys):
    monkeypatch.setenv("ACCELERANDO_MAIN_PROCESS_PORT", "99999")
    assert launch.main(["--dry-run", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "env:ACCELERANDO_MAIN_PROCESS_PORT" in err and "from 0 to 65535" in err


# (id, call, exception type, fragments): the settings API used directly, without the launcher.
API_CASES = [
    ("unknown setting name", lambda: get_field(HUGE), KeyError, ["Unknown setting", "(50000000 characters)"]),
    (
        "unknown code setting",
        lambda: resolve([{HUGE: Sourced(1, "code")}]),
        KeyError,
        ["(50000000 characters)"],
    ),
    (
        "huge code value",
        lambda: parse_value("dynamo_backend", HUGE),
        ValueError,
        ["code (an argument)", "(50000000 characters)"],
    ),
    ("infinite int", lambda: parse_value("num_processes", float("inf")), ValueError, ["num_processes"]),
    ("port above range", lambda: parse_value("main_process_port", 70000), ValueError, ["from 0 to 65535"]),
    (
        "huge list value in a config section",
        lambda: load_config_layer(_file("s.yaml", "fsdp_config: [" + "1, " * 10_000 + "1]\n")),
        ConfigError,
        ["must be a mapping", "characters)"],
    ),
    (
        "huge compute_environment",
        lambda: load_config_layer(_file("c.yaml", "compute_environment: " + "q" * 100_000 + "\n")),
        ConfigError,
        ["compute_environment", "(100000 characters)"],
    ),
]


@pytest.mark.parametrize("call, error, fragments", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_settings_api_errors_are_short(call, error, fragments):
    with pytest.raises(error) as info:
        call()
    message = str(info.value.args[0])
    assert len(message) < MAX_MESSAGE, message[:MAX_MESSAGE]
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_valid_edge_values_still_work(capsys):
    """Port 0 (a free port is chosen) and 65535 are allowed; a real program runs with --no_python."""
    for port in ("0", "65535"):
        assert launch.main(["--main_process_port", port, "--dry-run", "train.py"]) == 0
    assert parse_value("main_process_port", "0") == 0
    assert launch.main(["--no_python", "--dry-run", "true"]) == 0
    capsys.readouterr()


def test_quote_value():
    assert quote_value("short") == "'short'"
    assert quote_value("a" * 41) == "'" + "a" * 40 + "'... (41 characters)"
    assert quote_value(list(range(100))).endswith("characters)")
    assert quote_value(12) == "12"
