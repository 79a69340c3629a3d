"""What the examples import is installed by the extra examples/README.md names.

Every import in ``examples/`` (function-level ones included) is either the standard library,
accelerando itself, a base dependency of the project, or in the ``examples`` extra (the DeepSpeed
example: the ``deepspeed`` extra); what a script needs without importing it (the tracking example's
TensorBoard) is listed in ``RUN_WITH``. The quickstart, which the README's first command runs after a
plain ``pip install -e .``, needs base dependencies only.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: Import names whose distribution has another name, for those not installed here.
DISTRIBUTION_OF = {"yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow"}
#: What a script needs at run time without importing it by name.
RUN_WITH = {"by_feature/tracking.py": {"tensorboard"}, "by_feature/memory.py": {"matplotlib"}}
#: Extras beyond ``examples`` that one script needs, named on examples/README.md.
OWN_EXTRA = {"by_feature/deepspeed_with_config_support.py": "deepspeed"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict[str, set[str]]:
    """``"base"`` and each extra -> the normalised distribution names it installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"base": project["dependencies"], **project["optional-dependencies"]}
    return {
        group: {_normal(Requirement(r).name) for r in requirements} for group, requirements in groups.items()
    }


def _imports(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports (anywhere in it), not relative ones."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@functools.cache
def _installed() -> dict[str, list[str]]:
    return dict(packages_distributions())  # scans every installed distribution: once


def _distributions(path: Path) -> set[str]:
    """The distributions ``path`` needs: third-party imports, and what ``RUN_WITH`` lists."""
    installed = _installed()
    needed = set(RUN_WITH.get(path.relative_to(EXAMPLES).as_posix(), set()))
    for name in _imports(path) - set(sys.stdlib_module_names) - {"accelerando", "__future__"}:
        needed |= set(installed.get(name, [DISTRIBUTION_OF.get(name, name)]))
    return {_normal(name) for name in needed}


def _scripts() -> list[Path]:
    return sorted(EXAMPLES.rglob("*.py"))


@pytest.mark.parametrize("script", _scripts(), ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_each_example_needs_only_what_the_extra_installs(script: Path) -> None:
    groups = _project()
    own = OWN_EXTRA.get(script.relative_to(EXAMPLES).as_posix())
    covered = groups["base"] | groups["examples"] | (groups[own] if own else set())
    missing = sorted(_distributions(script) - covered)
    assert not missing, f"{script.name} needs {missing}: add them to the `examples` extra in pyproject.toml"


def test_the_quickstart_needs_the_base_dependencies_only() -> None:
    assert _distributions(EXAMPLES / "quickstart.py") <= _project()["base"]


def test_the_examples_readme_names_the_extras() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    assert 'pip install -e ".[examples]"' in readme
    for extra in set(OWN_EXTRA.values()):
        assert f'pip install -e ".[{extra}]"' in readme
    assert "tqdm" in _project()["examples"]
