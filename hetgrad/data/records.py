"""A dataset directory of record files, read by index -- a rank reads only its samples, no
file is ever loaded or mapped whole, so a dataset far larger than memory trains::

    DIR/manifest.json           what is where (written last: a directory without one is not
                                a dataset, e.g. a conversion still running)
    DIR/<split>/shard-00000/    a shard: a contiguous run of samples of split train or test
        <field>.npy             an array field: (count, *shape), one fixed shape per sample
        <field>.bin             a bytes field (e.g. JPEG files): the records one after another
        <field>.idx.npy         ... and their count + 1 offsets into it

Each split names its ``features`` and ``label`` fields; ``scale`` (float32 in [0, 1], as
``.npz`` images are read) or ``decode`` (``module:function`` of one sample, or
``image:HxW``: decode and resize an image file) turn what is stored into what the model takes.
Checked when opened, before any TensorFlow: the manifest, and every shard's files present with
the shape, type and size the manifest says (a truncated or replaced file is named).
"""
from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path

import numpy as np

from ..errors import InputFileError
from .sources import Dataset, Field, Source

FORMAT = "hetgrad-records/1"


def _bad(text: str) -> InputFileError:
    return InputFileError(text, field="data")


def read_manifest(directory: Path) -> dict:
    path = directory / "manifest.json"
    if not path.is_file():
        raise _bad(f"{directory} holds no manifest.json: not a dataset directory (or its "
                   "conversion did not finish: run `hetgrad data convert` again)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _bad(f"cannot read {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _bad(f"{path} is not a {FORMAT} manifest")
    return manifest


def open_dataset(directory: str | Path) -> Dataset:
    """The dataset of a directory made by ``hetgrad data convert`` (split ``train``, and
    ``test`` if it has one), every shard checked against the manifest."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    splits = manifest.get("splits", {})
    if "train" not in splits:
        raise _bad(f"{directory / 'manifest.json'} has no train split")
    train = RecordSource(directory, "train", manifest)
    test = RecordSource(directory, "test", manifest) if "test" in splits else None
    return Dataset(directory.name, train, test, tuple(manifest["input_shape"]),
                   int(manifest.get("classes", 0)))


class RecordSource(Source):
    """Split ``split`` of a dataset directory: samples ``(features, label)`` read by index
    from memory-mapped shard files."""

    def __init__(self, directory: Path, split: str, manifest: dict):
        self.name = f"{directory.name}/{split}"
        self.root = directory / split
        info = manifest["splits"][split]
        self.fields = info["fields"]
        self.features, self.label = manifest["features"], manifest.get("label")
        self.shards = [s["name"] for s in info["shards"]]
        counts = [int(s["count"]) for s in info["shards"]]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self.starts[-1] != info["count"]:
            raise _bad(f"{directory / 'manifest.json'}: the {split} shards hold "
                       f"{self.starts[-1]} samples, the manifest says {info['count']}")
        self.scale = manifest.get("scale", {}).get(split)
        self.decode = _decoder(manifest.get("decode"))
        for shard, count in zip(self.shards, counts):
            self._check_shard(shard, count)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _check_shard(self, shard: str, count: int) -> None:
        """Every file of ``shard`` there, of the manifest's shape, type and size."""
        for name, field in self.fields.items():
            base = self.root / shard / name
            if field["kind"] == "array":
                arr = _open_npy(base.with_suffix(".npy"))
                want = (count, *field["shape"])
                if arr.shape != want or arr.dtype != np.dtype(field["dtype"]):
                    raise _bad(f"{base}.npy holds {arr.dtype} {arr.shape}, the manifest says "
                               f"{field['dtype']} {want}")
            else:
                idx = _open_npy(Path(f"{base}.idx.npy"))
                blob = Path(f"{base}.bin")
                if idx.shape != (count + 1,):
                    raise _bad(f"{base}.idx.npy indexes {len(idx) - 1} records, the manifest "
                               f"says {count}")
                size = blob.stat().st_size if blob.is_file() else -1
                if size != int(idx[-1]):
                    raise _bad(f"{blob} is {'missing' if size < 0 else f'{size} bytes'}; its "
                               f"index says {int(idx[-1])} bytes (truncated or replaced)")

    @cached_property
    def _layout(self) -> dict:
        """Per shard and field, read once: an array field's (file, offset of record 0, dtype,
        shape), a bytes field's (file, offsets). Records are read with ``pread`` -- nothing is
        mapped, so a rank's memory does not grow with the files it reads from (the page cache
        holds them, shared and reclaimable)."""
        layout = {}
        for shard in self.shards:
            for name, field in self.fields.items():
                base = self.root / shard / name
                if field["kind"] == "array":
                    header = np.load(f"{base}.npy", mmap_mode="r")
                    layout[shard, name] = (f"{base}.npy", header.offset, header.dtype,
                                           header.shape[1:])
                else:
                    layout[shard, name] = (f"{base}.bin", np.load(f"{base}.idx.npy"))
        return layout

    def _field(self, name: str, indices: np.ndarray) -> np.ndarray:
        which = np.searchsorted(self.starts, indices, side="right") - 1
        out = None
        for s in np.unique(which):
            here = which == s
            got = self._read(self.shards[s], name, indices[here] - self.starts[s])
            if out is None:
                out = np.empty((len(indices), *got.shape[1:]), got.dtype)
            out[here] = got
        return out

    def _read(self, shard: str, name: str, local: np.ndarray) -> np.ndarray:
        path, *where = self._layout[shard, name]
        fd = os.open(path, os.O_RDONLY)
        try:
            if self.fields[name]["kind"] == "array":
                first, dtype, shape = where
                size = dtype.itemsize * int(np.prod(shape))
                raw = b"".join(os.pread(fd, size, first + int(i) * size) for i in local)
                return np.frombuffer(raw, dtype).reshape(len(local), *shape)
            offsets = where[0]
            return np.array([os.pread(fd, int(offsets[i + 1] - offsets[i]), int(offsets[i]))
                             for i in local], object)
        finally:
            os.close(fd)

    def take(self, indices: np.ndarray):
        indices = np.asarray(indices, np.int64)
        x = _structure(self.features, lambda f: self._field(f, indices))
        if self.scale is not None:
            x = (x.astype(np.float32) * np.float32(1.0 / self.scale))
            x = x[..., None] if x.ndim == 3 else x
        return (x,) if self.label is None else (x, self._field(self.label, indices))

    @property
    def signature(self):
        one = self.take(np.zeros(1, np.int64))
        return tuple(Field(a.dtype, a.shape[1:]) if not isinstance(a, dict) else
                     {k: Field(v.dtype, v.shape[1:]) for k, v in a.items()} for a in one)


def _structure(features, read):
    """One field, or a dict of several (a model with several inputs)."""
    if isinstance(features, str):
        return read(features)
    return {name: read(name) for name in features}


def _open_npy(path: Path) -> np.ndarray:
    if not path.is_file():
        raise _bad(f"{path} is missing")
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise _bad(f"cannot read {path}: {exc} (truncated or replaced?)") from None


def _decoder(spec: str | None):
    """The per-sample decode a manifest names (resolved when the reader first uses it)."""
    if not spec:
        return None
    from .decode import decoder
    return decoder(spec)
