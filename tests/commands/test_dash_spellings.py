"""Every multi-word CLI flag takes both spellings: ``--num_processes`` and ``--num-processes``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from accelerando.commands import launch
from accelerando.commands.cli import build_parser
from accelerando.commands.spellings import SPELLING_NOTE, other_spelling
from accelerando.core.settings.fields import FIELDS


def _dashed(argv: list[str]) -> list[str]:
    return [other_spelling(a) or a if a.startswith("--") and "-" not in a[2:] else a for a in argv]


SUBCOMMAND_ARGS = [
    ["env", "--config_file", "x.yaml"],
    ["config", "--config_file", "x.yaml", "default", "--mixed_precision", "bf16", "--save_location", "y"],
    ["config", "update", "--config_file", "y.yaml"],
    ["estimate-memory", "model", "--library_name", "timm", "--trust_remote_code"],
    [
        "merge-weights",
        "a",
        "b",
        "--max_shard_size",
        "1GB",
        "--remove_checkpoint_dir",
        "--unsafe_serialization",
    ],
    ["test", "--config_file", "z.yaml"],
]


@pytest.mark.parametrize("argv", SUBCOMMAND_ARGS, ids=lambda a: " ".join(a[:2]))
def test_subcommands_parse_both_spellings_alike(argv: list[str]) -> None:
    dashed = _dashed(argv)
    assert dashed != argv
    parser = build_parser()
    underscore_ns, underscore_rest = parser.parse_known_args(argv)
    dash_ns, dash_rest = parser.parse_known_args(dashed)
    assert underscore_rest == dash_rest == []
    assert vars(underscore_ns) == vars(dash_ns)


def test_every_launch_field_flag_takes_the_dash_spelling() -> None:
    parser = launch.build_parser()
    for field in FIELDS:
        if field.cli and "_" in field.cli:
            argv = [field.cli.replace("_", "-")] + ([] if field.switch else ["7"])
            args = launch.parse(parser, [*argv, "train.py"])
            assert args.unknown_args == [], field.cli
            # Numbers are parsed as numbers (the reference's parser types them too).
            number = {"int": 7, "float": 7.0}.get(field.kind, "7")
            assert getattr(args, field.name) == (True if field.switch else number), field.cli


def test_launch_both_spellings_give_the_same_namespace_and_keep_script_flags() -> None:
    base = ["--num_processes", "2", "--mixed_precision", "bf16", "--config_file", "x.yaml", "--log_dir", "d"]
    base += ["--dynamo_backend", "inductor", "--use_fsdp", "--fsdp_sharding_strategy", "FULL_SHARD"]
    base += ["--no_python", "--fp8_backend", "te", "--tpu_use_cluster", "--dry_run"]
    script = ["train.py", "--learning_rate", "1", "--batch-size", "2", "--num-processes", "3"]
    parser = launch.build_parser()
    underscore = launch.parse(parser, [*base, *script])
    dash = launch.parse(parser, [*_dashed(base), *script])
    assert vars(underscore) == vars(dash)
    assert dash.training_script == "train.py"
    assert dash.training_script_args == script[1:]
    assert (dash.num_processes, dash.mixed_precision, dash.config_file) == (2, "bf16", "x.yaml")
    equals = launch.parse(parser, ["--num-processes=2", "train.py"])
    assert equals.num_processes == 2 and equals.unknown_args == []


def test_abbreviation_is_not_ambiguous_between_spellings() -> None:
    args = launch.parse(launch.build_parser(), ["--mixed-prec=bf16", "--num_proc=2", "train.py"])
    assert (args.mixed_precision, args.num_processes, args.unknown_args) == ("bf16", 2, [])


@pytest.mark.parametrize("typo", ["--num-proceses", "--num_proceses", "--num-proceses=2"])
def test_dash_typo_names_the_listed_flag(typo: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = launch.parse(launch.build_parser(), [typo, "train.py"])
    assert launch.run(args) == 2
    assert "did you mean --num_processes?" in capsys.readouterr().err


def test_help_lists_each_flag_once_and_mentions_dashes() -> None:
    text = launch.build_parser().format_help()
    # The dash spelling appears once, in the note's example (as the reference's help has it once).
    assert text.count("--num-processes") == 1 and "--num_processes" in text
    assert text.count(SPELLING_NOTE) == 1
    parser = build_parser()
    assert SPELLING_NOTE in parser.format_help()


def test_dry_run_with_dash_spellings_in_a_subprocess(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    out = subprocess.run(
        [sys.executable, "-m", "accelerando.commands.cli", "launch", "--dry-run", "--cpu", "--num-processes", "2",
         "--mixed-precision", "bf16", str(script), "--my-flag", "1"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "num_processes = 2  [cli:--num_processes]" in out.stdout
    assert "mixed_precision = 'bf16'  [cli:--mixed_precision]" in out.stdout
    assert "--my-flag 1" in out.stdout
