"""Every ``accelerate`` name the Hugging Face libraries use resolves on accelerando at the same path.

The installed sources of transformers, peft, trl and diffusers are walked with ``ast``
(``accelerate_names.collect``): ``from accelerate.x import y``, ``import accelerate.x``, attribute
chains on those imports, ``"accelerate.x.y"`` strings (``mock.patch`` targets) and attributes read on
an ``accelerator``. Their test suites and examples, and the reference's own examples, benchmarks and
tests, are not installed: the uses found there are recorded in ``accelerate_names_outside_packages.txt``.
Each use is resolved in a fresh interpreter on the real ``accelerate``, then on accelerando through
``install_as_accelerate()`` (never in this process); every use that resolves on the reference must
resolve here, private names included, except the few in ``NOT_MIRRORED`` (each with its reason).

The walk of the installed sources (a few seconds: ~280 files mention accelerate) is kept in a cache
file keyed by the libraries' versions and the walker's source.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import torch
from accelerate_names import collect

HERE = Path(__file__).resolve().parent
PROBE = HERE / "accelerate_names.py"
RECORDED = HERE / "accelerate_names_outside_packages.txt"
LIBRARIES = ("transformers", "peft", "trl", "diffusers")

#: Uses that resolve on the reference and are deliberately not mirrored, with the reason.
NOT_MIRRORED = {
    "accelerator _prepare_fsdp2": "the reference Accelerator's private FSDP2 preparation step, called only by "
    "its own white-box FSDP2 tests (which patch its internals); accelerando prepares FSDP2 in its strategy",
}

pytest.importorskip("accelerate")


def _installed_roots() -> list[Path]:
    roots = []
    for name in LIBRARIES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.append(Path(next(iter(spec.submodule_search_locations))))
    return roots


def _cache_file(roots: list[Path]) -> Path:
    key = hashlib.sha256(PROBE.read_bytes())
    for root in roots:
        key.update(f"{root}={importlib.metadata.version(root.name)};".encode())
    return (
        Path(tempfile.gettempdir())
        / "accelerando-test-cache"
        / f"accelerate-names-{key.hexdigest()[:16]}.json"
    )


@pytest.fixture(scope="module")
def uses() -> dict[str, str]:
    """``"kind path"`` -> where it was first seen, for the installed libraries and the recorded list."""
    roots = _installed_roots()
    assert roots, f"none of {LIBRARIES} is installed (they are in the test extra)"
    cache = _cache_file(roots)
    if cache.exists():
        found: dict[str, str] = json.loads(cache.read_text())
    else:
        found = {}
        for use in collect(roots):
            found.setdefault(f"{use.kind} {use.path}", use.where)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(found))
    for line in RECORDED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            use, _, where = line.partition("  # ")
            found.setdefault(use.strip(), where.strip())
    return found


def _resolve_all(uses: dict[str, str], tmp_path: Path) -> dict[str, dict[str, str | None]]:
    """Resolve every use on both sides, the two interpreters running at once."""
    listing = tmp_path / "uses.json"
    listing.write_text(json.dumps([key.split(" ", 1) for key in sorted(uses)]))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    runs = {
        side: subprocess.Popen(
            [sys.executable, str(PROBE), "--side", side, "--uses", str(listing)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for side in ("reference", "accelerando")
    }
    results = {}
    for side, run in runs.items():
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, f"{side} probe failed:\n{err[-4000:]}"
        results[side] = json.loads(out)
    return results


def test_every_name_the_libraries_use_resolves_here(uses: dict[str, str], tmp_path: Path) -> None:
    seen = _resolve_all(uses, tmp_path)
    reference, ours = seen["reference"], seen["accelerando"]
    needed = sorted(key for key, error in reference.items() if error is None)
    missing = [key for key in needed if ours[key] is not None and key not in NOT_MIRRORED]
    resolved = sum(ours[key] is None for key in needed)
    print(
        f"\naccelerate names used: {len(uses)}; resolve on the reference: {len(needed)}; "
        f"resolve on accelerando: {resolved} (+{len(NOT_MIRRORED)} not mirrored on purpose)"
    )
    assert not missing, "\n".join(f"{key} ({uses[key]}): {ours[key]}" for key in missing)
    for key in NOT_MIRRORED:
        assert key in needed, (
            f"{key} is no longer used or no longer on the reference: drop it from NOT_MIRRORED"
        )
        assert ours[key] is not None, f"{key} resolves now: drop it from NOT_MIRRORED"


GET_PROPER_DTYPE_INPUTS = [
    "float16",
    "torch.bfloat16",
    "float",
    "int8",
    "torch.torch.float32",
    "float16torch.",
    "fp16",
    "xtorch.float16",
    "float8_e4m3fn",
    None,
    3,
]


def _describe(value: object) -> str:
    return repr(value) if not isinstance(value, BaseException) else f"raises {type(value).__name__}"


def test_get_proper_dtype_gives_the_references_results() -> None:
    """diffusers' tests import the private ``accelerate.utils.modeling._get_proper_dtype``."""
    from accelerando.utils.modeling import _get_proper_dtype

    script = (
        "import json, torch\n"
        "from accelerate.utils.modeling import _get_proper_dtype as f\n"
        "inputs = ['float16', 'torch.bfloat16', 'float', 'int8', 'torch.torch.float32', 'float16torch.',\n"
        "          'fp16', 'xtorch.float16', 'float8_e4m3fn', None, 3]\n"
        "def describe(x):\n"
        "    try:\n"
        "        return repr(f(x))\n"
        "    except Exception as e:\n"
        "        return 'raises ' + type(e).__name__\n"
        "print(json.dumps([describe(x) for x in inputs]))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    reference = json.loads(run.stdout.strip().splitlines()[-1])
    ours = []
    for value in GET_PROPER_DTYPE_INPUTS:
        try:
            ours.append(_describe(_get_proper_dtype(value)))  # type: ignore[arg-type]
        except AttributeError as error:
            ours.append(_describe(error))
    assert ours == reference
    assert _get_proper_dtype("torch.float16") is torch.float16


def test_patching_which_at_the_utils_path_reaches_the_launch_code() -> None:
    """``mock.patch("accelerando.utils.launch.which")`` works as through the reference's path."""
    import accelerando.launchers.reference as owner
    import accelerando.utils.launch as launch

    assert launch.which is owner.which and launch.subprocess is owner.subprocess
    with (
        mock.patch("accelerando.utils.launch.which", return_value="/usr/bin/mpirun"),
        mock.patch("accelerando.utils.launch.subprocess.check_output", return_value=b"Intel MPI"),
    ):
        assert owner._mpirun().flavour == "mpich"
    with (
        mock.patch("accelerando.utils.launch.which", return_value=None),
        pytest.raises(OSError, match="mpirun"),
    ):
        owner._mpirun()
    assert launch.which is owner.which  # restored on both


_HANDLER_SCRIPT = """
import json, sys, warnings
warnings.simplefilter("ignore")
if sys.argv[1] == "accelerando":
    import accelerando
    accelerando.install_as_accelerate()
import accelerate
from accelerate.state import AcceleratorState
names = ["fp8_recipe_handler", "ao_recipe_handler", "te_recipe_handler", "msamp_recipe_handler",
         "has_fp8_handler", "fp8_enabled", "delayed_fp8_autocast", "has_lomo_optimizer", "log_with",
         "ddp_handler", "scaler_handler", "init_handler", "autocast_handler", "profile_handler"]
seen = {}
for tag, kwargs in [("plain", {}), ("fp8", {"mixed_precision": "fp8"}),
                    ("log_with", {"log_with": "tensorboard", "project_dir": sys.argv[2]})]:
    AcceleratorState._reset_state(True)
    accelerator = accelerate.Accelerator(cpu=True, **kwargs)
    seen[tag] = {n: type(getattr(accelerator, n)).__name__ if n.endswith("handler") else repr(getattr(accelerator, n))
                 for n in names}
print(json.dumps(seen))
"""


def test_the_accelerators_handler_attributes_match_the_reference(tmp_path: Path) -> None:
    """``fp8_recipe_handler`` and its family (an unchanged reference example reads it)."""
    pytest.importorskip("torchao")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    runs = {
        side: subprocess.Popen(
            [sys.executable, "-c", _HANDLER_SCRIPT, side, str(tmp_path / side)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for side in ("reference", "accelerando")
    }
    seen = {}
    for side, run in runs.items():
        out, err = run.communicate(timeout=180)
        assert run.returncode == 0, err[-3000:]
        seen[side] = json.loads(out.strip().splitlines()[-1])
    assert seen["accelerando"] == seen["reference"]
