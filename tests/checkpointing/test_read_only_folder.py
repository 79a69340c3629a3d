"""Saving into a folder the user cannot write to: one line naming that folder and the fix.

The folder is made read-only with ``chmod 0o555`` where that stops this user, else (root, whom
permissions do not stop) with a read-only bind mount in a mount namespace of the save's own
(``unshare --mount``; ``--map-root-user`` for a user without the capability); the test is skipped,
saying why, where neither is possible. The save runs in a child process, so the mount never leaves it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mount namespaces are Linux's")

# argv: the read-only folder. Three saves: an explicit folder inside it, automatic naming with it as
# the project folder (no checkpoints folder yet), and automatic naming in a project inside it whose
# checkpoints folder exists already. Prints one JSON line per save: the error's type and message.
SAVES = """\
import json, sys
import torch
from accelerando import Accelerator
from accelerando.utils import ProjectConfiguration

folder = sys.argv[1]
cases = [("explicit", {}, folder + "/out"),
         ("project", {"project_dir": folder, "automatic_checkpoint_naming": True}, None),
         ("existing", {"project_dir": folder + "/existing", "automatic_checkpoint_naming": True}, None)]
for name, config, output_dir in cases:
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(**config))
    accelerator.prepare(torch.nn.Linear(2, 2))
    try:
        accelerator.save_state(output_dir)
        print(json.dumps([name, None, None]))
    except Exception as err:
        print(json.dumps([name, type(err).__name__, str(err)]))
"""


def _blocked(folder: Path, prefix: list[str]) -> bool:
    """Whether creating a file in ``folder`` fails when run behind ``prefix``."""
    probe = [*prefix, "sh", "-c", f"touch {folder}/.probe"] if prefix else ["touch", f"{folder}/.probe"]
    result = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    if result.returncode == 0:
        (folder / ".probe").unlink(missing_ok=True)
    return result.returncode != 0 and ("Read-only" in result.stderr or "Permission denied" in result.stderr)


def _read_only_runner(folder: Path) -> list[str]:
    """A command prefix under which ``folder`` is read-only for the command it runs; skips if none works."""
    folder.chmod(0o555)
    if _blocked(folder, []):
        return []
    folder.chmod(0o755)  # root (or CAP_DAC_OVERRIDE): permissions do not stop it, a read-only mount does
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("chmod does not stop this user (root) and there is no unshare for a read-only mount")
    mount = f'mount --bind {folder} {folder} && mount -o remount,ro,bind {folder} {folder} && exec "$@"'
    for flags in (
        ["--mount", "--propagation", "private"],
        ["--map-root-user", "--mount", "--propagation", "private"],
    ):
        prefix = [unshare, *flags, "sh", "-c", mount, "sh"]
        if _blocked(folder, prefix):
            return prefix
    pytest.skip("chmod does not stop this user and no read-only bind mount could be made (unshare refused)")


def test_a_read_only_folder_is_reported_as_such_with_the_fix(tmp_path: Path) -> None:
    folder = tmp_path / "read_only"
    (folder / "existing" / "checkpoints").mkdir(parents=True)
    script = tmp_path / "saves.py"
    script.write_text(SAVES)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    try:
        prefix = _read_only_runner(folder)
        result = subprocess.run(
            [*prefix, sys.executable, str(script), str(folder)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        folder.chmod(0o755)
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = {name: (kind, message) for name, kind, message in map(json.loads, result.stdout.splitlines())}
    # The folder each save needed to write into: where the checkpoint, or its checkpoints folder, goes.
    needed = {"explicit": folder, "project": folder, "existing": folder / "existing" / "checkpoints"}
    for name, where in needed.items():
        kind, message = outcomes[name]
        assert kind in ("PermissionError", "OSError"), (name, kind, message)
        assert f"the folder '{where}' is not writable" in message, (name, message)
        assert "save elsewhere" in message and "fix its permissions" in message, (name, message)
        assert "lock" not in message and "\n" not in message, (name, message)
    assert os.listdir(folder) == ["existing"] and os.listdir(folder / "existing") == ["checkpoints"]
