"""The checkpoint manifest: what a complete checkpoint holds, and verification against it.

A manifest lists every file of a checkpoint folder with its size and checksum. It is written last by
:func:`accelerando.checkpointing.atomic.commit` and read first by every load.

The manifest is the complete list of what a load may read, and a checksum is not a signature, so
reading treats the folder as untrusted input:

- any manifest that does not parse into exactly the expected shape (a JSON list, wrong types, a
  missing key, an unknown or ``"none"`` checksum algorithm) is damage;
- every entry must be a plain relative name inside the folder (no ``..``, no absolute path, no empty
  part), checked before anything is opened or ``stat``-ed, so nothing outside the folder ever is;
- symbolic links (and other non-regular files) inside a checkpoint are refused, never followed;
- a file a loader would read that the manifest does not list is damage (:func:`require_listed`).
"""

from __future__ import annotations

import json
import os
import stat
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from accelerando.checkpointing.digest import FileEntry, available, digest_files, known
from accelerando.core.safe_files import read_regular

__all__ = [
    "MANIFEST_NAME",
    "CheckpointError",
    "Manifest",
    "check_name",
    "check_size",
    "checkable_entries",
    "checksum_mismatch",
    "inspect_checkpoint",
    "read_manifest",
    "require_listed",
    "scan_folder",
    "verify_checkpoint",
    "verify_checksums",
]

MANIFEST_NAME = "checkpoint_manifest.json"
MANIFEST_FORMAT = 1
# Far above any real manifest (about 100 bytes per file); a bigger one is damage, not read into memory.
MAX_MANIFEST_BYTES = 64 * 2**20


class CheckpointError(RuntimeError):
    """A checkpoint folder is incomplete or damaged; the message names the folder and the file."""


@dataclass
class Manifest:
    """Description of a complete checkpoint folder (written last, read first)."""

    files: dict[str, FileEntry]
    world_size: int
    library_version: str
    created: float = field(default_factory=time.time)
    extra: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> str:
        """Serialise to the manifest file's JSON text: one line per field and per file.

        Each line is encoded by ``json``'s C encoder (an ``indent`` would send the whole document
        through the pure-Python one, a tenth of a small save's time).
        """
        head = {
            "format": MANIFEST_FORMAT,
            "library": "accelerando",
            "library_version": self.library_version,
            "world_size": self.world_size,
            "created": self.created,
            "extra": self.extra,
        }
        lines = [f" {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
        files = [
            f"  {json.dumps(name)}: "
            + json.dumps({"size": e.size, "checksum": e.checksum, "algorithm": e.algorithm})
            for name, e in sorted(self.files.items())
        ]
        listed = "{\n" + ",\n".join(files) + "\n }" if files else "{}"
        return "{\n" + "\n".join(lines) + '\n "files": ' + listed + "\n}"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse and validate a manifest's JSON text.

        Raises:
            ValueError: If it is not valid JSON or not exactly a manifest's shape (the message says
                which part is wrong). ``read_manifest`` turns every failure into ``CheckpointError``.
        """
        payload = json.loads(text)
        if not isinstance(payload, dict):
            raise ValueError(f"expected a JSON object, found a JSON {_json_kind(payload)}")
        if payload.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unknown manifest format {_short(payload.get('format'))}")
        files = _field(payload, "files", dict)
        extra = payload.get("extra", {})
        if not isinstance(extra, dict):
            raise ValueError(f"'extra' must be an object, found a JSON {_json_kind(extra)}")
        world_size = _field(payload, "world_size", int)
        if world_size < 1:
            raise ValueError(f"'world_size' must be at least 1, found {world_size}")
        created = _field(payload, "created", (int, float))
        return cls(
            files={check_name(name): _entry(name, value) for name, value in files.items()},
            world_size=world_size,
            library_version=_field(payload, "library_version", str),
            created=float(created),
            extra=dict(extra),
        )


_T = TypeVar("_T")


def _json_kind(value: object) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def _short(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field(
    mapping: Mapping[str, object], key: str, kind: type[_T] | tuple[type[_T], ...], where: str = ""
) -> _T:
    """``mapping[key]``, which must be of ``kind`` (booleans are not numbers here)."""
    if key not in mapping:
        raise ValueError(f"{where}'{key}' is missing")
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{where}'{key}' has the wrong type: {_short(value)}")
    return value


def _entry(name: str, value: object) -> FileEntry:
    where = f"entry {_short(name)}: "
    if not isinstance(value, dict):
        raise ValueError(f"{where}expected an object, found a JSON {_json_kind(value)}")
    size, checksum = _field(value, "size", int, where), _field(value, "checksum", int, where)
    algorithm = _field(value, "algorithm", str, where)
    if size < 0 or checksum < 0:
        raise ValueError(f"{where}negative size or checksum")
    if not known(algorithm):
        raise ValueError(f"{where}unknown checksum algorithm {_short(algorithm)}")
    return FileEntry(size, checksum, algorithm)


def check_name(name: object) -> str:
    """Return ``name`` if it is a plain relative name inside a folder (``a.bin``, ``sub/a.bin``).

    Raises:
        ValueError: For anything else: not a string, empty, absolute, a drive, a NUL byte, or an
            empty, ``.`` or ``..`` part (either slash counts as a separator).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"file name {_short(name)} is not a plain relative name")
    parts = name.replace("\\", "/").split("/")
    if (
        "\x00" in name
        or os.path.isabs(name)
        or os.path.splitdrive(name)[0]
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ValueError(f"file name {_short(name)} is not a plain relative name inside the folder")
    return name


def read_manifest(folder: str) -> Manifest:
    """Read and validate a checkpoint's manifest (never following a symbolic link).

    Raises:
        CheckpointError: If the manifest is missing, is a link or not a regular file, is too big, or
            cannot be parsed into a valid manifest for any reason (the message names it).
    """
    path = os.path.join(folder, MANIFEST_NAME)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(
            f"Checkpoint {folder!r} is incomplete (a save was interrupted) or was not written by accelerando: "
            f"it has no {MANIFEST_NAME}. Load another checkpoint."
        ) from None
    except OSError as err:
        raise _damaged(folder, f"{MANIFEST_NAME} cannot be read ({err.strerror})") from err
    if stat.S_ISLNK(info.st_mode):
        raise _damaged(folder, f"{MANIFEST_NAME} is a symbolic link (links are never followed)")
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MANIFEST_BYTES:
        raise _damaged(folder, f"{MANIFEST_NAME} is not a regular file of at most {MAX_MANIFEST_BYTES} bytes")
    try:
        # Checked again on the open descriptor (non-blocking, no link): a FIFO swapped in never blocks.
        return Manifest.from_json(read_regular(path, MAX_MANIFEST_BYTES, follow=False).decode("utf-8"))
    except Exception as err:  # noqa: BLE001 - whatever the reason, an unparsable manifest means damage
        reason = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        raise _damaged(folder, f"{path!r} cannot be parsed ({reason[:200]})") from err


def _damaged(folder: str, what: str) -> CheckpointError:
    return CheckpointError(f"Checkpoint {folder!r} is damaged: {what}; load another checkpoint.")


def scan_folder(folder: str, recursive: bool = True) -> dict[str, int]:
    """Size of every file in ``folder`` by relative ``/``-joined name, without following any link.

    Only entries inside ``folder`` are looked at (``lstat``, never ``stat``).

    Args:
        recursive: Also scan sub-folders (False: only the folder's own entries).

    Raises:
        CheckpointError: If an entry is a symbolic link or neither a regular file nor a folder.
    """
    found: dict[str, int] = {}
    pending = [""]
    while pending:
        prefix = pending.pop()
        with os.scandir(os.path.join(folder, prefix) if prefix else folder) as entries:
            for entry in entries:
                name = f"{prefix}/{entry.name}" if prefix else entry.name
                if entry.is_symlink():
                    raise CheckpointError(
                        f"Checkpoint {folder!r} holds a symbolic link, {name!r}: links inside a checkpoint are "
                        "refused, never followed. Replace it with the file itself (e.g. cp -L), or load "
                        "another checkpoint."
                    )
                if entry.is_dir(follow_symlinks=False):
                    if recursive:
                        pending.append(name)
                elif entry.is_file(follow_symlinks=False):
                    found[name] = entry.stat(follow_symlinks=False).st_size
                else:
                    raise _damaged(folder, f"{name!r} is neither a regular file nor a folder")
    return found


def require_listed(folder: str, manifest: Manifest, names: Iterable[str]) -> None:
    """Check that the manifest lists every named file (the manifest is the complete list).

    Raises:
        CheckpointError: Naming the first file a loader would read that the manifest does not list.
    """
    for name in names:
        if name not in manifest.files:
            raise _damaged(
                folder,
                f"file {name!r} would be read but its {MANIFEST_NAME} does not list it (the manifest was "
                "altered, or the file was added after the save)",
            )


def check_size(folder: str, name: str, entry: FileEntry, present: Mapping[str, int]) -> None:
    """Compare the size of ``name`` in ``present`` (sizes by name) with its manifest ``entry``.

    Raises:
        CheckpointError: If the file is missing or its size differs (the message names it).
    """
    size = present.get(name)
    if size is None:
        raise CheckpointError(
            f"Checkpoint {folder!r} is damaged: file {name!r} listed in its manifest is missing; "
            "load another checkpoint."
        )
    if size != entry.size:
        raise CheckpointError(
            f"Checkpoint {folder!r} is damaged: file {name!r} has {size} bytes, the manifest says "
            f"{entry.size} (truncated or overwritten); load another checkpoint."
        )


def checkable_entries(folder: str, wanted: Mapping[str, FileEntry], stacklevel: int) -> dict[str, FileEntry]:
    """The entries of ``wanted`` whose checksum this installation can compute, in order; one warning
    (at ``stacklevel``, as seen from the caller) for each of the others, which only their size checks.
    """
    checkable = {}
    for name, entry in wanted.items():
        if available(entry.algorithm):
            checkable[name] = entry
        else:
            warnings.warn(
                f"Cannot verify {name!r} in {folder!r}: its {entry.algorithm} checksum needs a library this "
                "installation lacks (pip install xxhash); only its size was checked.",
                stacklevel=stacklevel + 1,
            )
    return checkable


def _check_checksums(folder: str, wanted: dict[str, FileEntry]) -> None:
    checkable = checkable_entries(folder, wanted, stacklevel=4)
    actual = digest_files(
        [(os.path.join(folder, name), e.algorithm) for name, e in checkable.items()],
        desc=f"Verifying {os.path.basename(os.path.normpath(folder))}",
    )
    for (name, entry), found in zip(checkable.items(), actual, strict=True):
        if found.checksum != entry.checksum or found.size != entry.size:
            raise checksum_mismatch(folder, name, entry, found)


def checksum_mismatch(folder: str, name: str, entry: FileEntry, found: FileEntry) -> CheckpointError:
    """The error for file ``name`` whose checksum ``found`` differs from its manifest ``entry``."""
    return CheckpointError(
        f"Checkpoint {folder!r} is damaged: file {name!r} fails its {entry.algorithm} checksum "
        f"({found.checksum:#x}, manifest {entry.checksum:#x}); load another checkpoint."
    )


def verify_checksums(folder: str, manifest: Manifest, names: Iterable[str]) -> None:
    """Compare the named files' checksums with a manifest already checked by :func:`verify_checkpoint`.

    All pieces of all the files are hashed in parallel.

    Raises:
        CheckpointError: Naming the first file the manifest does not list, or the first corrupted one.
    """
    names = list(names)
    require_listed(folder, manifest, names)
    _check_checksums(folder, {n: manifest.files[n] for n in names})


def inspect_checkpoint(folder: str) -> tuple[Manifest, dict[str, int]]:
    """Parse the manifest, scan the folder (links refused) and compare every listed file's size.

    Returns:
        The manifest and the size of every file in the folder (see :func:`scan_folder`).

    Raises:
        CheckpointError: As :func:`verify_checkpoint`.
    """
    manifest = read_manifest(folder)
    present = scan_folder(folder)
    for name, entry in manifest.files.items():
        check_size(folder, name, entry, present)
    return manifest, present


def verify_checkpoint(folder: str, checksums: bool = False, names: Iterable[str] | None = None) -> Manifest:
    """Check a checkpoint folder against its manifest.

    The manifest is parsed and validated, the folder's entries are scanned without following links
    (any link is refused), and the listed files' sizes are compared; nothing outside the folder is
    opened or ``stat``-ed.

    Args:
        folder: The checkpoint folder.
        checksums: Also compare every file's checksum (reads every byte, all files' pieces in parallel);
            sizes are always checked.
        names: Only check these files (default: every file in the manifest); each must be listed.

    Returns:
        The manifest.

    Raises:
        CheckpointError: Naming the first missing, unlisted, truncated or corrupted file, a link, or
            a manifest that cannot be parsed.
    """
    if names is None:
        manifest, _ = inspect_checkpoint(folder)
        wanted = manifest.files
    else:
        manifest, present = read_manifest(folder), scan_folder(folder)
        names = list(names)
        require_listed(folder, manifest, names)
        wanted = {n: manifest.files[n] for n in names}
        for name, entry in wanted.items():
            check_size(folder, name, entry, present)
    if checksums:
        _check_checksums(folder, wanted)
    return manifest
