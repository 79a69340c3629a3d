"""Checkpoint folders written by the reference library's ``save_state`` (no manifest).

Such a folder is recognised by its file names (``random_states_<rank>.pkl`` plus the reference's
names for weights, optimizers, schedulers, loaders, the scaler and custom objects), checked for the
files' presence and readable headers, and loaded without checksums (one warning says so). Reading
stays weights-only: the reference's random-state files hold NumPy arrays, which are read with only
NumPy's array reconstruction allowed besides torch's own weights-only types; a pickled sampler
object (``sampler.bin``) cannot be read that way and is skipped with a warning.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from accelerando.checkpointing.files import torch_load
from accelerando.checkpointing.headers import _check_header, check_file_header
from accelerando.checkpointing.manifest import CheckpointError
from accelerando.core.safe_files import open_regular

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "check_file_header",
    "check_reference_files",
    "is_reference_checkpoint",
    "read_reference_rng",
    "reference_rng_payload",
]

_RNG = re.compile(r"random_states_\d+\.pkl")
_LAYOUT = re.compile(
    r"(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|optimizer(_\d+)?\.bin|scheduler(_\d+)?\.bin"
    r"|sampler(_\d+)?\.bin|dl_state_dict(_\d+)?\.bin|scaler\.pt|random_states_\d+\.pkl"
    r"|custom_checkpoint_\d+\.pkl)"
)
# A random-states pickle is a few KiB; one far bigger is not scanned.
_MAX_RNG_PICKLE = 2**20


# A random-states archive is a few KiB (a CUDA machine's adds a state per device); one far bigger is
# not scanned.
_MAX_RNG_FILE = 64 * 2**20


def _rng_file_is_reference(path: str) -> bool:
    """Whether a random-states archive holds the reference's keys (its pickle is scanned, not run).

    The file is opened without following a link and without blocking, and scanned only when it is a
    regular file of a sane size: a FIFO or a link to ``/dev/zero`` in its place would otherwise hang
    the scan (and with it ``latest_checkpoint`` and automatic resume).
    """
    import zipfile

    try:
        with open_regular(path, _MAX_RNG_FILE, follow=False) as handle, zipfile.ZipFile(handle) as archive:
            for info in archive.infolist():
                if info.filename.endswith("/data.pkl") and info.file_size <= _MAX_RNG_PICKLE:
                    with archive.open(info) as member:
                        return b"torch_manual_seed" in member.read(_MAX_RNG_PICKLE + 1)
    except (OSError, zipfile.BadZipFile, RuntimeError, ValueError, EOFError):
        # Unreadable, or not a regular file: let the layout decide, so that loading reports the
        # damage by name (the folder scan refuses links and special files before anything is read).
        return True
    return False


def is_reference_checkpoint(present: dict[str, int] | list[str], folder: str | None = None) -> bool:
    """Whether a folder's files (no manifest among them) are the reference's ``save_state`` layout.

    With ``folder``, a random-states file must also hold the reference's keys, so that one of
    accelerando's own checkpoints whose manifest was lost is not taken for the reference's.
    """
    names = sorted(name for name in present if _RNG.fullmatch(name))
    if not names:
        return False
    return folder is None or _rng_file_is_reference(os.path.join(folder, names[0]))


def check_reference_files(folder: str, present: dict[str, int]) -> None:
    """Check that every file of the reference layout in ``folder`` has a readable header.

    Raises:
        CheckpointError: Naming the first file whose header is wrong (truncated or not the format
            its name says).
    """
    for name, size in sorted(present.items()):
        if _LAYOUT.fullmatch(name):
            _check_header(os.path.join(folder, name), name, size)


def _numpy_allowlist() -> list[Callable[..., object] | tuple[Callable[..., object], str]]:
    """NumPy's array reconstruction under both module names NumPy versions pickle it with."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    allowed: list[Callable[..., object] | tuple[Callable[..., object], str]] = [
        (_reconstruct, "numpy._core.multiarray._reconstruct"),
        (_reconstruct, "numpy.core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
    ]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        allowed.append(dtypes.UInt32DType)
    return allowed


# Any: the values are generator states as read from the file (restore_rng_states takes them).
def read_reference_rng(path: str) -> dict[str, Any]:
    """Read a ``random_states_<rank>.pkl`` weights-only (NumPy arrays of numbers allowed).

    The reference's format holds ``torch_manual_seed`` & co.; accelerando's own (a folder whose
    manifest was removed) holds ``rng``: both are accepted.

    Raises:
        UnsafeCheckpointError: If the file holds anything else that needs full unpickling.
        CheckpointError: If it is not a dict of generator states.
    """
    import torch

    with torch.serialization.safe_globals(_numpy_allowlist()):
        payload = torch_load(path)
    if not isinstance(payload, dict) or not ("torch_manual_seed" in payload or "rng" in payload):
        raise CheckpointError(
            f"Cannot restore this checkpoint's random states: {path!r} is not a random-states file written "
            "by save_state. Load another checkpoint."
        )
    return payload


def reference_rng_payload(payload: Mapping[str, object]) -> dict[str, object]:
    """Turn a reference random-states dict into what ``restore_rng_states`` takes.

    Raises:
        CheckpointError: If the NumPy state is not the uint32 Mersenne Twister state NumPy writes.
    """
    import numpy as np

    states: dict[str, object] = {"python": payload["random_state"], "torch": payload["torch_manual_seed"]}
    numpy_state = payload.get("numpy_random_seed")
    if numpy_state is not None:
        key = numpy_state[1] if isinstance(numpy_state, tuple) and len(numpy_state) > 1 else None
        if not isinstance(key, np.ndarray) or key.dtype != np.uint32:
            raise CheckpointError(
                "Cannot restore the random states of this checkpoint (the reference library's): its NumPy "
                "state is not the uint32 Mersenne Twister state NumPy writes. Load another checkpoint."
            )
        states["numpy"] = numpy_state
    else:
        states["numpy"] = np.random.get_state()
    cuda = payload.get("torch_cuda_manual_seed")
    if cuda is not None:
        states["cuda"] = cuda
    return {"source": "local", "states": states}
