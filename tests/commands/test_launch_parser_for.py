"""``parser_for(argv)``: the launch parser narrowed to the flags ``argv`` can name parses as the full one.

A one-process launch builds only the flags its command line can name (exactly or as an abbreviation,
in either spelling); the others take their usual value. Hypothesis draws command lines from every
flag's spellings and prefixes, with ``=`` forms, values that look like flags, unknown flags, short
options and ``--help``, and checks that the namespace, or the usage error and exit status, is the
full parser's.
"""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelerando.commands.launch.parser import build_parser, parse, parser_for

FULL = build_parser()
OPTIONS = sorted({option for option in FULL._option_string_actions if option.startswith("--")})
SHORT = ["-m", "-q", "-t", "-h", "-qm", "-x"]
VALUES = ["1", "2", "bf16", "fp16", "no", "true", "cpu", "-1", "--", "--x", "0.5", "auto"]


def _outcome(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[str, object]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = parse(parser, argv)
        except SystemExit as stop:
            return "exit", (stop.code, out.getvalue(), err.getvalue())
    return "args", vars(args)


@st.composite
def _tokens(draw: st.DrawFn) -> list[str]:
    option = draw(st.sampled_from(OPTIONS))
    cut = draw(st.integers(min_value=3, max_value=len(option)))
    name = draw(st.sampled_from([option, option[:cut], "--" + option[2:cut] + "zz"]))
    kind = draw(st.sampled_from(["bare", "value", "equals", "short"]))
    if kind == "short":
        return [draw(st.sampled_from(SHORT))]
    if kind == "equals":
        return [f"{name}={draw(st.sampled_from(VALUES))}"]
    if kind == "value":
        return [name, draw(st.sampled_from(VALUES))]
    return [name]


@given(
    st.lists(_tokens(), max_size=5).map(lambda groups: [token for group in groups for token in group]),
    st.sampled_from([[], ["train.py"], ["train.py", "--num_processes", "3", "-h"], ["-m"]]),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_narrowed_parser_parses_as_the_full_one(head: list[str], tail: list[str]) -> None:
    argv = head + tail
    assert _outcome(parser_for(argv), argv) == _outcome(FULL, argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--num_processes", "2", "train.py"],
        ["--num-proc", "2", "--mixed_precision=bf16", "train.py", "--lr", "1"],
        ["--use_fsdp", "--fsdp_sharding_strategy", "FULL_SHARD", "train.py"],
        ["--dynamo_backend", "inductor", "-q", "train.py"],
        ["--tpu", "--main_training_function", "main", "train.py"],
        ["--mixed", "bf16", "train.py"],  # an abbreviation of one flag (both spellings)
        ["--num", "2", "train.py"],  # ambiguous: several flags start with it
        ["--vm", "x", "train.py"],  # a refused flag
        ["--no_such_flag", "train.py"],
    ],
)
def test_common_command_lines(argv: list[str]) -> None:
    narrowed = parser_for(argv)
    assert _outcome(narrowed, argv) == _outcome(FULL, argv)


def test_a_plain_launch_builds_a_handful_of_flags() -> None:
    """Counted work: one given flag adds only the flags it can name, not the ~150 of the table."""
    narrowed = parser_for(["--num_processes", "1", "train.py"])
    added = {option for action in narrowed._actions for option in action.option_strings}
    assert "--num_processes" in added
    assert len(narrowed._actions) <= 12 < len(FULL._actions) / 10


@pytest.mark.parametrize("argv", [["--help"], ["--he"], ["-h"], ["-qh", "x.py"]])
def test_help_gets_every_flag(argv: list[str]) -> None:
    assert len(parser_for(argv)._actions) == len(FULL._actions)


def _unique_prefixes() -> list[tuple[str, bool]]:
    """(an abbreviation only one flag's spellings start with, whether that flag takes a value)."""
    found = []
    for option, action in FULL._option_string_actions.items():
        if not option.startswith("--") or option == "--ray":
            continue
        for cut in range(3, len(option) + 1):
            prefix = option[:cut]
            owners = {id(a) for o, a in FULL._option_string_actions.items() if o.startswith(prefix)}
            if owners == {id(action)}:
                found.append((prefix, action.nargs != 0))
                break
    return found


ABBREVIATIONS = _unique_prefixes()


@given(st.lists(st.sampled_from(ABBREVIATIONS), max_size=6), st.booleans())
@settings(max_examples=200, deadline=None)
def test_abbreviated_flags_take_their_value_and_the_script_is_found(
    flags: list[tuple[str, bool]], with_script_flags: bool
) -> None:
    """``--num_proc 2 train.py``: an abbreviated value flag takes the next word, as argparse's would."""
    from accelerando.commands.launch.flags import split_unknown

    head = [token for prefix, takes_value in flags for token in ([prefix, "7"] if takes_value else [prefix])]
    tail = ["train.py", *(["--num_processes", "3"] if with_script_flags else [])]
    assert split_unknown(head + tail) == (head, tail)


def test_an_abbreviated_value_flag_launches() -> None:
    args = parse(FULL, ["--num_proc", "2", "--mixed", "bf16", "train.py", "--lr", "1"])
    assert (args.num_processes, args.mixed_precision) == (2, "bf16")
    assert (args.training_script, args.training_script_args) == ("train.py", ["--lr", "1"])


def test_the_split_knows_exactly_the_parser_s_options() -> None:
    """flags.py lists which options take a value (to find the script); it must agree with the parser."""
    from accelerando.commands.launch.flags import _launcher_options

    values, switches = _launcher_options()
    parser_options = {
        option: action.nargs != 0
        for option, action in FULL._option_string_actions.items()
        if option != "--ray"  # its value is optional: split_unknown decides by the word after it
    }
    assert values | switches == set(parser_options) | {"--ray"}
    assert {option for option, takes_value in parser_options.items() if takes_value} == values - {"--ray"}
