"""Zip bombs for issue 41 item 5, used by tests/checkpointing/test_zip_bomb.py (no tests here).

:func:`write_bomb` writes a ``torch.save`` archive whose ``data.pkl`` is deflated: the real pickle
followed by zeros, so that it inflates to about ``inflated_bytes`` (a 3 MB file inflates to about
3 GB). The deflate stream is built without compressing gigabytes: after a full flush a compressor's
output for 64 MiB of zeros is the same block every time, so that block is repeated.

``python zip_bomb_worker.py <folder> <inflated MiB>`` (run in a fresh process): saves a checkpoint of
a small model and AdamW optimizer, puts a bomb in place of its ``optimizer.bin`` (the manifest
recomputed, as an attacker would: a checksum is no signature), then loads it and prints one JSON
line: ``{"baseline_kib", "peak_kib", "error", "file_bytes"}`` (max RSS before and after the load).
"""

from __future__ import annotations

import io
import json
import os
import resource
import sys
import zipfile
import zlib

CHUNK = bytes(64 * 2**20)


class _RepeatingDeflate:
    """Stands in for zlib's compressor while zipfile writes one entry: the head, then zero chunks."""

    def __init__(self, head: bytes) -> None:
        first = zlib.compressobj(9, zlib.DEFLATED, -15)
        self.prefix = first.compress(head) + first.flush(zlib.Z_FULL_FLUSH)
        repeat = zlib.compressobj(9, zlib.DEFLATED, -15)
        repeat.compress(CHUNK)
        repeat.flush(zlib.Z_FULL_FLUSH)
        self.block = repeat.compress(CHUNK) + repeat.flush(zlib.Z_FULL_FLUSH)  # the same each time now
        self.tail = repeat.flush(zlib.Z_FINISH)
        self.head = head

    def compress(self, data: bytes) -> bytes:
        if data is self.head:
            return self.prefix
        assert data is CHUNK
        return self.block

    def flush(self) -> bytes:
        return self.tail


def write_bomb(path: str, state: object, inflated_bytes: int) -> None:
    """``torch.save(state)`` rewritten so that its ``data.pkl`` is deflated and inflates to about
    ``inflated_bytes`` (its pickle first, then zeros, which the unpickler never reaches).
    """
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    chunks = max(1, inflated_bytes // len(CHUNK))
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(path, "w") as out:
        for info in source.infolist():
            data = source.read(info)
            if not info.filename.endswith("/data.pkl"):
                out.writestr(info.filename, data, compress_type=zipfile.ZIP_STORED)
                continue
            fake = _RepeatingDeflate(data)
            real = zipfile._get_compressor  # pyright: ignore[reportAttributeAccessIssue]
            zipfile._get_compressor = lambda *_, fake=fake: fake  # pyright: ignore[reportAttributeAccessIssue]
            try:
                entry = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                entry.compress_type = zipfile.ZIP_DEFLATED
                with out.open(entry, "w", force_zip64=True) as sink:
                    sink.write(data)
                    for _ in range(chunks):
                        sink.write(CHUNK)
            finally:
                zipfile._get_compressor = real  # pyright: ignore[reportAttributeAccessIssue]


def _resign(folder: str) -> None:
    """Recompute every manifest entry, as an attacker who edited the files would."""
    from accelerando.checkpointing.atomic import MANIFEST_NAME, file_digest

    path = os.path.join(folder, MANIFEST_NAME)
    with open(path, encoding="utf-8") as handle:
        payload = json.load(handle)
    for name in payload["files"]:
        entry = file_digest(os.path.join(folder, name))
        payload["files"][name] = {
            "size": entry.size,
            "checksum": entry.checksum,
            "algorithm": entry.algorithm,
        }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle)


def main(folder: str, inflated_mib: int) -> None:
    import torch

    from accelerando import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.ones(1, 64)).sum().backward()
    optimizer.step()
    accelerator.save_state(folder)
    bomb = os.path.join(folder, "optimizer.bin")
    write_bomb(bomb, optimizer.state_dict(), inflated_mib * 2**20)
    _resign(folder)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    error = None
    try:
        accelerator.load_state(folder)
    except Exception as err:  # noqa: BLE001 - reported
        error = f"{type(err).__name__}: {err}"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {"baseline_kib": baseline, "peak_kib": peak, "error": error, "file_bytes": os.path.getsize(bomb)}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
