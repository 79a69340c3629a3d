"""Compare a client suite's JUnit results: baseline (the reference) against candidate (accelerando).

    compare.py SUITE BASELINE_JUNIT_DIR CANDIDATE_JUNIT_DIR

Prints, per test file, how many of the tests that pass on the reference pass through the stand-in, lists each
that does not with the first line of its message, counts the tests that fail on the reference because they need
a Hub repository no stand-in was built for ("needs hub": they count in neither figure), and ends with one line.
"""

from __future__ import annotations

import pathlib
import re
import sys
import xml.etree.ElementTree as ET

NEEDS_HUB = re.compile(
    r"couldn't connect|offline mode|OfflineModeIsEnabled|LocalEntryNotFound|Couldn't reach|is not cached|"
    r"not a local folder and is not a valid model identifier|Cannot find the requested files in the disk cache|"
    r"outgoing traffic has been disabled|huggingface\.co",
    re.IGNORECASE,
)


def outcomes(folder: pathlib.Path) -> dict[str, tuple[str, str, str]]:
    """Map 'class::test' to (outcome, message, file) for every testcase in the folder's XML files."""
    found: dict[str, tuple[str, str, str]] = {}
    for xml in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            node = f"{case.get('classname', '')}::{case.get('name', '')}"
            outcome, message = "passed", ""
            for child in case:
                if child.tag in ("error", "failure", "skipped"):
                    outcome = {"failure": "failed"}.get(child.tag, child.tag)
                    message = f"{child.get('message') or ''}\n{child.text or ''}"
                    break
            found[node] = (outcome, message, xml.name.removesuffix(".xml"))
    return found


def first_line(message: str) -> str:
    """The message's first non-empty line, cut to 160 characters."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0][:160] if lines else ""


def main() -> None:
    """Entry point; see the module docstring."""
    suite, base_dir, cand_dir = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    base, cand = outcomes(base_dir), outcomes(cand_dir)
    per_file: dict[str, list[int]] = {}
    regressions, needs_hub, other_fail = [], 0, 0
    for node, (outcome, message, test_file) in sorted(base.items()):
        counts = per_file.setdefault(test_file, [0, 0])
        if outcome in ("failed", "error"):
            if NEEDS_HUB.search(message):
                needs_hub += 1
            else:
                other_fail += 1
        if outcome != "passed":
            continue
        counts[1] += 1
        got, cmessage, _ = cand.get(node, ("absent", "not run: the file failed to import or timed out", ""))
        if got == "passed":
            counts[0] += 1
        else:
            regressions.append((node, got, first_line(cmessage)))
    for module, (ok, total) in sorted(per_file.items()):
        print(f"{module:60s} {ok:4d}/{total}")
    for node, got, message in regressions:
        print(f"  - {node}: {got}: {message}")
    passed = sum(ok for ok, _ in per_file.values())
    total = sum(t for _, t in per_file.values())
    skipped = sum(1 for o, _, _ in base.values() if o == "skipped")
    print(
        f"{suite}: {passed} of {total} tests that pass with the reference also pass with accelerando "
        f"({len(regressions)} regressions); on the reference {needs_hub} need the Hub, {other_fail} fail "
        f"otherwise, {skipped} skipped, of {len(base)} run"
    )


if __name__ == "__main__":
    main()
