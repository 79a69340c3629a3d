"""The checkpoint manifest: what a complete checkpoint holds, and verification against it.

A manifest lists every file of a checkpoint folder with its size and checksum. It is written last by
:func:`accelerando.checkpointing.atomic.commit` and read first by every load.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from accelerando.checkpointing.digest import FileEntry, available, digest_files

__all__ = [
    "MANIFEST_NAME",
    "CheckpointError",
    "Manifest",
    "read_manifest",
    "verify_checkpoint",
    "verify_checksums",
]

MANIFEST_NAME = "checkpoint_manifest.json"
MANIFEST_FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint folder is incomplete or damaged; the message names the folder and the file."""


@dataclass
class Manifest:
    """Description of a complete checkpoint folder (written last, read first)."""

    files: dict[str, FileEntry]
    world_size: int
    library_version: str
    created: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """Serialise to the manifest file's JSON text."""
        payload = {
            "format": MANIFEST_FORMAT,
            "library": "accelerando",
            "library_version": self.library_version,
            "world_size": self.world_size,
            "created": self.created,
            "extra": self.extra,
            "files": {
                name: {"size": e.size, "checksum": e.checksum, "algorithm": e.algorithm}
                for name, e in sorted(self.files.items())
            },
        }
        return json.dumps(payload, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse a manifest's JSON text (raises ``KeyError``/``ValueError``/``TypeError`` if malformed)."""
        payload = json.loads(text)
        if payload.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unknown manifest format {payload.get('format')!r}")
        files = {
            name: FileEntry(int(e["size"]), int(e["checksum"]), str(e["algorithm"]))
            for name, e in payload["files"].items()
        }
        return cls(
            files=files,
            world_size=int(payload["world_size"]),
            library_version=str(payload["library_version"]),
            created=float(payload["created"]),
            extra=dict(payload.get("extra", {})),
        )


def read_manifest(folder: str) -> Manifest:
    """Read a checkpoint's manifest.

    Raises:
        CheckpointError: If the manifest is missing or unreadable (the message names it).
    """
    path = os.path.join(folder, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            return Manifest.from_json(handle.read())
    except FileNotFoundError:
        raise CheckpointError(
            f"Checkpoint {folder!r} has no {MANIFEST_NAME}: it is incomplete (a save was interrupted) "
            "or was not written by accelerando; load another checkpoint."
        ) from None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise CheckpointError(
            f"Checkpoint {folder!r} is damaged: {path!r} cannot be parsed ({err}); load another checkpoint."
        ) from err


def _check_size(folder: str, name: str, entry: FileEntry) -> None:
    try:
        size = os.stat(os.path.join(folder, name)).st_size
    except FileNotFoundError:
        raise CheckpointError(
            f"Checkpoint {folder!r} is damaged: file {name!r} listed in its manifest is missing; "
            "load another checkpoint."
        ) from None
    if size != entry.size:
        raise CheckpointError(
            f"Checkpoint {folder!r} is damaged: file {name!r} has {size} bytes, the manifest says "
            f"{entry.size} (truncated or overwritten); load another checkpoint."
        )


def _check_checksums(folder: str, wanted: dict[str, FileEntry]) -> None:
    checkable = {}
    for name, entry in wanted.items():
        if available(entry.algorithm):
            checkable[name] = entry
        else:
            warnings.warn(
                f"Cannot verify {name!r} in {folder!r}: its {entry.algorithm} checksum needs a library this "
                "installation lacks (pip install xxhash); only its size was checked.",
                stacklevel=4,
            )
    actual = digest_files(
        [(os.path.join(folder, name), e.algorithm) for name, e in checkable.items()],
        desc=f"Verifying {os.path.basename(os.path.normpath(folder))}",
    )
    for (name, entry), found in zip(checkable.items(), actual, strict=True):
        if found.checksum != entry.checksum or found.size != entry.size:
            raise CheckpointError(
                f"Checkpoint {folder!r} is damaged: file {name!r} fails its {entry.algorithm} checksum "
                f"({found.checksum:#x}, manifest {entry.checksum:#x}); load another checkpoint."
            )


def verify_checksums(folder: str, manifest: Manifest, names: Iterable[str]) -> None:
    """Compare the named files' checksums with an already read and size-checked manifest.

    All pieces of all the files are hashed in parallel; names the manifest does not list are skipped.

    Raises:
        CheckpointError: Naming the first corrupted file.
    """
    _check_checksums(folder, {n: manifest.files[n] for n in names if n in manifest.files})


def verify_checkpoint(folder: str, checksums: bool = False, names: Iterable[str] | None = None) -> Manifest:
    """Check a checkpoint folder against its manifest.

    Args:
        folder: The checkpoint folder.
        checksums: Also compare every file's checksum (reads every byte, all files' pieces in parallel);
            sizes are always checked.
        names: Only check these files (default: every file in the manifest).

    Returns:
        The manifest.

    Raises:
        CheckpointError: Naming the first missing, truncated or corrupted file.
    """
    manifest = read_manifest(folder)
    wanted = manifest.files if names is None else {n: manifest.files[n] for n in names if n in manifest.files}
    for name, entry in wanted.items():
        _check_size(folder, name, entry)
    if checksums:
        _check_checksums(folder, wanted)
    return manifest
