"""The conformance ratchet's support: read the reference suite's JUnit results, keep the passing list.

The list (``passing.txt`` beside this file) holds the node ids of the reference's own tests (accelerate
1.15.0, run through ``install_as_accelerate()`` by ``../shared/conformance/run.sh``) that pass on
accelerando. Test ids are facts; the reference's test code stays out of this repository.

    python tests/conformance/ratchet.py update .conformance/candidate/junit   # rewrite the list from a run
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

PASSING_LIST = Path(__file__).with_name("passing.txt")
# Tests whose outcome depends on the machine's state rather than on the package: never listed.
UNSTABLE_LIST = Path(__file__).with_name("unstable.txt")
_HEADER = (
    "# Reference tests (accelerate 1.15.0's own suite) that pass on accelerando; tests/conformance/\n"
    "# test_reference_suite.py fails when one of them stops passing. Regenerate after a fix with\n"
    "#   python tests/conformance/ratchet.py update <CONFORMANCE_DIR>/candidate/junit\n"
)


def _node_id(case: ET.Element) -> str:
    # classname carries the folder the suite ran from ('.conformance-x.accelerate-1.15.0.tests.test_y.Class');
    # keep it from 'tests.' on so ids do not depend on where the run happened.
    classname = case.get("classname", "")
    marker = classname.find("tests.test_")
    return f"{classname[marker:] if marker >= 0 else classname}::{case.get('name', '')}"


def passed_tests(junit_folder: Path) -> set[str]:
    """Return the node ids of every test that passed in the JUnit XML files of ``junit_folder``.

    Raises:
        FileNotFoundError: the folder holds no XML file.
    """
    files = sorted(junit_folder.glob("*.xml"))
    if not files:
        raise FileNotFoundError(f"no JUnit XML files in {junit_folder}")
    passed: set[str] = set()
    for path in files:
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            if not any(child.tag in ("failure", "error", "skipped") for child in case):
                passed.add(_node_id(case))
    return passed


def listed_tests() -> set[str]:
    """Return the node ids in the passing list (comments and blank lines ignored)."""
    lines = PASSING_LIST.read_text(encoding="utf-8").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def unstable_tests() -> set[str]:
    """Return the node ids of unstable.txt (``<node id> | reason`` lines)."""
    lines = UNSTABLE_LIST.read_text(encoding="utf-8").splitlines()
    return {line.split("|")[0].strip() for line in lines if line.strip() and not line.startswith("#")}


def update(junit_folder: Path) -> int:
    """Rewrite the passing list from a run's JUnit folder; return how many ids it holds."""
    ids = sorted(passed_tests(junit_folder) - unstable_tests())
    PASSING_LIST.write_text(_HEADER + "".join(f"{node}\n" for node in ids), encoding="utf-8")
    return len(ids)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "update":
        sys.exit(__doc__)
    print(f"{update(Path(sys.argv[2]))} reference tests listed in {PASSING_LIST}")
