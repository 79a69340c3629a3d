"""Rules that keep the architecture (shared/DESIGN.md) true, checked on the source tree."""

from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "accelerando"

# Where os.environ may appear, and why.
ENVIRON_ALLOWED = {
    "settings",  # the resolver reads the launcher's variables
    "environments",  # cluster environments read rank / world size
    "devices",  # device visibility variables
    "launchers",  # the only writers of child-process environments
    "utils/environment.py",  # patch_environment & co. exist to edit os.environ
    "utils/fsdp.py",  # the reference API toggles FSDP RAM-efficient loading through an env var
    "logging.py",  # the log level must be readable before any state exists
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


def test_import_accelerando_is_light():
    code = (
        "import json, sys; import torch; before = set(sys.modules); import accelerando; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    added = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    assert all(name.startswith("accelerando") for name in added), added
    assert len(added) <= 5, added


def test_accelerator_import_loads_no_optional_library():
    code = (
        "import json, sys, torch; before = set(sys.modules); from accelerando import Accelerator; Accelerator(); "
        f"print(json.dumps([m for m in {OPTIONAL!r} if m in sys.modules and m not in before]))"
    )
    loaded = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    assert loaded == []


def test_cli_help_does_not_import_torch():
    code = (
        "import sys\nsys.argv = ['accelerando', '--help']\nfrom accelerando.commands.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\nprint('TORCH', 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "TORCH False" in out
