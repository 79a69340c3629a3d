"""Rules that keep the architecture (shared/DESIGN.md) true, checked on the source tree."""

from __future__ import annotations

import ast
import json
import pathlib
import re
import sys
from collections.abc import Iterator

import pytest

from suite_support import ConcurrentProbes

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "accelerando"

# Where os.environ may appear, and why.
ENVIRON_ALLOWED = {
    "core/settings",  # the resolver reads the launcher's variables
    "core/environments",  # cluster environments read rank / world size
    "core/devices",  # device visibility variables
    "launchers",  # the only writers of child-process environments
    "common/torch_xla.py",  # tells a Colab / Kaggle host by its variables (install_xla only)
    "commands/tpu.py",  # hands the environment to the gcloud command it runs
    "commands/config/config_args.py",  # where the reference keeps its config file (HF_HOME)
    "common/environment.py",  # patch_environment & co. exist to edit os.environ
    "backends/strategies/fsdp/checkpoint.py",  # the reference API toggles FSDP RAM-efficient loading through an env var
    "logging.py",  # the log level must be readable before any state exists
    "commands/spellings.py",  # the help text's width: $COLUMNS, as shutil.get_terminal_size reads it
    "test_utils",  # sets torchrun-style variables inside spawned test processes
}

OPTIONAL = [
    "deepspeed",
    "transformers",
    "tensorboard",
    "wandb",
    "mlflow",
    "comet_ml",
    "aim",
    "clearml",
    "dvclive",
    "swanlab",
    "trackio",
    "neptune",
    "matplotlib",
    "pynvml",
    "questionary",
    "tqdm",
    "transformer_engine",
    "torchao",
    "megatron",
    "datasets",
    "torchdata",
    "bitsandbytes",
    "rich",
    "ray",
]


def _py_files():
    return [p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts]


def test_distributed_type_compared_only_in_connector():
    pattern = re.compile(r"(==|!=|\bis\b|\bin\b)\s*\(?\s*DistributedType\.")
    offenders = [
        f"{p.relative_to(SRC)}:{i}"
        for p in _py_files()
        if p.name != "connector.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_os_environ_only_where_allowed():
    offenders = []
    for p in _py_files():
        rel = p.relative_to(SRC).as_posix()
        if any(rel == a or rel.startswith(a + "/") for a in ENVIRON_ALLOWED):
            continue
        if "os.environ" in p.read_text() or "os.getenv" in p.read_text():
            offenders.append(rel)
    assert offenders == []


def test_no_optional_library_imported_at_module_level():
    offenders = []
    for p in _py_files():
        tree = ast.parse(p.read_text())
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in OPTIONAL:
                    offenders.append(f"{p.relative_to(SRC)}: {name}")
    assert offenders == []


_LIGHT_IMPORT_PROBE = (
    "import json, sys; import torch; before = set(sys.modules); import accelerando; "
    "print(json.dumps(sorted(set(sys.modules) - before)))"
)
_ACCELERATOR_IMPORT_PROBE = (
    "import json, sys, torch; before = set(sys.modules); from accelerando import Accelerator; Accelerator(); "
    f"print(json.dumps([m for m in {OPTIONAL!r} if m in sys.modules and m not in before]))"
)
_CLI_HELP_PROBE = (
    "import sys\nsys.argv = ['accelerando', '--help']\nfrom accelerando.commands.cli import main\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\nprint('TORCH', 'torch' in sys.modules)"
)


@pytest.fixture(scope="module", autouse=True)
def import_probes(request: pytest.FixtureRequest) -> Iterator[ConcurrentProbes]:
    """The three fresh interpreters below, started together with the module's first test (each test
    checks its own; the source-tree checks run meanwhile)."""
    commands = {
        "test_import_accelerando_is_light": _LIGHT_IMPORT_PROBE,
        "test_accelerator_import_loads_no_optional_library": _ACCELERATOR_IMPORT_PROBE,
        "test_cli_help_does_not_import_torch": _CLI_HELP_PROBE,
    }
    running = ConcurrentProbes(
        request, {test: {"args": [sys.executable, "-c", code]} for test, code in commands.items()}
    )
    try:
        yield running
    finally:
        running.close()


def _stdout(probes: ConcurrentProbes, test: str) -> str:
    done = probes.result(test)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_import_accelerando_is_light(import_probes: ConcurrentProbes):
    added = json.loads(_stdout(import_probes, "test_import_accelerando_is_light"))
    assert all(name.startswith("accelerando") for name in added), added
    assert len(added) <= 5, added


def test_accelerator_import_loads_no_optional_library(import_probes: ConcurrentProbes):
    loaded = json.loads(_stdout(import_probes, "test_accelerator_import_loads_no_optional_library"))
    assert loaded == []


def test_cli_help_does_not_import_torch(import_probes: ConcurrentProbes):
    out = _stdout(import_probes, "test_cli_help_does_not_import_torch")
    assert "TORCH False" in out


# Backend and distributed-type names; comparing them as strings outside the connector and the
# strategies is how `if distributed_type == ...` chains creep back in.
_BACKEND_NAMES = (
    r"MULTI_(?:CPU|GPU|NPU|MLU|SDAA|MUSA|XPU|HPU)|DEEPSPEED|FSDP|MEGATRON_LM|XLA|deepspeed|fsdp|megatron|ddp"
)
_NAME_LITERAL = rf"""["'](?:{_BACKEND_NAMES})["']"""
_STRING_COMPARISON = re.compile(
    rf"(?:==|!=)\s*{_NAME_LITERAL}|{_NAME_LITERAL}\s*(?:==|!=)|\bin\s*[(\[{{][^)\]}}]*{_NAME_LITERAL}"
)


def _string_comparisons(text: str) -> list[int]:
    return [i for i, line in enumerate(text.splitlines(), 1) if _STRING_COMPARISON.search(line)]


def test_backend_names_compared_as_strings_only_in_connector_and_strategies():
    offenders = []
    for p in _py_files():
        rel = p.relative_to(SRC).as_posix()
        if rel == "backends/connector.py" or rel.startswith("backends/strategies/"):
            continue
        offenders += [f"{rel}:{i}" for i in _string_comparisons(p.read_text())]
    assert offenders == []


def test_string_comparison_rule_catches_the_usual_spellings():
    caught = [
        'if s.distributed_type == "MULTI_GPU":',
        'if mode == "deepspeed":',
        'if "FSDP" == name:',
        'if kind in ("FSDP", "DEEPSPEED"):',
        "if backend != 'fsdp':",
    ]
    left = ['if mixed_precision == "fp16":', 'switch = {"FSDP": "use_fsdp"}.get(value)', 'name = "ddp"']
    assert [bool(_string_comparisons(line)) for line in caught] == [True] * len(caught)
    assert [bool(_string_comparisons(line)) for line in left] == [False] * len(left)


def _tabled_variables() -> set[str]:
    from accelerando.core.settings import FIELDS

    return {var for field in FIELDS for var in field.env_names}


_ENV_READERS = {"get", "getenv", "parse_flag_from_env", "get_int_from_env", "pop", "setdefault"}


def _tabled_reads(tree: ast.AST, tabled: set[str]) -> list[int]:
    """Lines reading a tabled setting's variable (``os.environ.get("ACCELERATE_X")`` and the like)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in _ENV_READERS:
                continue
            args = [a for arg in node.args for a in ast.walk(arg)]
            if any(isinstance(a, ast.Constant) and a.value in tabled for a in args):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if isinstance(node.slice, ast.Constant) and node.slice.value in tabled:
                lines.append(node.lineno)
    return lines


def test_tabled_settings_are_read_only_through_the_settings():
    tabled = _tabled_variables()
    offenders = []
    for p in _py_files():
        rel = p.relative_to(SRC).as_posix()
        if rel.startswith("core/settings/"):
            continue
        offenders += [f"{rel}:{i}" for i in _tabled_reads(ast.parse(p.read_text()), tabled)]
    assert offenders == []


def test_tabled_read_rule_catches_the_usual_spellings():
    tabled = _tabled_variables()
    caught = [
        'os.environ.get("ACCELERATE_MIXED_PRECISION")',
        'os.getenv("ACCELERATE_DEBUG_MODE", "0")',
        'parse_flag_from_env("ACCELERATE_USE_CPU")',
        'os.environ["ACCELERANDO_LOG_LEVEL"]',
        'get_int_from_env(["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"], 1)',
    ]
    assert all(_tabled_reads(ast.parse(line), tabled) for line in caught)
    assert not _tabled_reads(ast.parse('os.environ.get("RANK")'), tabled)
    assert not _tabled_reads(ast.parse('env["ACCELERATE_MIXED_PRECISION"] = "bf16"'), tabled)
