"""Writing one shard of a dataset directory (:mod:`.records`): fields appended sample by
sample (or a block at a time), then the shard made whole at once -- written under a temporary
name with a ``meta.json`` (counts, fields, sizes, SHA-256 of every file) and renamed, so a
shard on disk is always complete and a conversion that stopped resumes after the last one."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..errors import InputFileError

META = "meta.json"


class ShardWriter:
    """One shard of ``split`` in ``directory``: :meth:`add` samples (a dict field -> value:
    a numpy array of a fixed shape, or bytes), then :meth:`close`."""

    def __init__(self, directory: Path, split: str, name: str):
        self.final = Path(directory) / split / name
        self.tmp = self.final.with_name(f".{name}.tmp")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.arrays: dict[str, list] = {}
        self.blobs: dict[str, tuple] = {}
        self.count = 0

    def add(self, sample: dict, where: str) -> None:
        """One sample; ``where`` (file and record) names it in an error."""
        for name, value in sample.items():
            if isinstance(value, bytes):
                self._bytes(name, value, where)
            else:
                self._array(name, np.asarray(value), where)
        self.count += 1

    def add_block(self, arrays: dict) -> None:
        """Many samples of array fields at once (e.g. a slice of an .npz)."""
        counts = {len(a) for a in arrays.values()}
        for name, block in arrays.items():
            self.arrays.setdefault(name, []).append(np.asarray(block))
        self.count += counts.pop()

    def _array(self, name: str, value: np.ndarray, where: str) -> None:
        blocks = self.arrays.setdefault(name, [])
        if blocks and (blocks[0].shape[1:] != value.shape or blocks[0].dtype != value.dtype):
            raise InputFileError(f"{where}: {name} is {value.dtype} {value.shape}, earlier "
                                 f"records {blocks[0].dtype} {blocks[0].shape[1:]}",
                                 field="src")
        blocks.append(value[None])

    def _bytes(self, name: str, value: bytes, where: str) -> None:
        if name not in self.blobs:
            self.blobs[name] = (open(self.tmp / f"{name}.bin", "wb"), [0])
        handle, offsets = self.blobs[name]
        handle.write(value)
        offsets.append(offsets[-1] + len(value))

    def close(self) -> dict:
        """Write everything, checksum it, rename the shard into place; its meta."""
        fields = {}
        for name, blocks in self.arrays.items():
            data = np.concatenate(blocks)
            np.save(self.tmp / f"{name}.npy", data)
            fields[name] = {"kind": "array", "dtype": data.dtype.str, "shape": list(data.shape[1:])}
        for name, (handle, offsets) in self.blobs.items():
            handle.close()
            np.save(self.tmp / f"{name}.idx.npy", np.asarray(offsets, np.int64))
            fields[name] = {"kind": "bytes"}
        meta = {"name": self.final.name, "count": self.count, "fields": fields,
                "sha256": {p.name: sha256(p) for p in sorted(self.tmp.iterdir())}}
        (self.tmp / META).write_text(json.dumps(meta))
        shutil.rmtree(self.final, ignore_errors=True)
        os.replace(self.tmp, self.final)
        return meta


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def done_meta(directory: Path, split: str, name: str) -> dict | None:
    """The meta of a shard already written whole (a resumed conversion skips it)."""
    path = Path(directory) / split / name / META
    return json.loads(path.read_text()) if path.is_file() else None
