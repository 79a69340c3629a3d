"""`env_command` returns the reference's summary keys (callers of the function read them)."""

from __future__ import annotations

from unittest.mock import patch

from accelerando.commands import env


def test_env_command_returns_the_reference_summary(capsys) -> None:
    args = env.env_command_parser().parse_args([])
    with patch.object(env, "which", return_value=None):
        info = env.env_command(args)
    assert info["`accelerate` bash location"] == "Not found"
    assert info["`Accelerate` version"] and info["Python version"] and info["status"] == 0
    assert "Command: Not found" in capsys.readouterr().out
