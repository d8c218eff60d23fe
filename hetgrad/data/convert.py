"""``hetgrad data convert SRC DST``: what users have -- a Keras-format ``.npz``, TFRecord files
(with their own parse function), an image folder (a class per sub-folder) -- as a dataset
directory of record files (:mod:`.records`), split over the ranks of the launch (rank ``r``
writes shards ``r, r + P, ...``). Resumable: a shard on disk is whole (:mod:`.writer`), and
the same command again writes only the missing ones; never overwrites a finished dataset or
another directory without ``--overwrite``; ``manifest.json`` comes last."""
from __future__ import annotations

import glob
import itertools
import json
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import InputFileError
from ..io import write_json
from .arrays import NPZ_KEYS, check_arrays
from .records import FORMAT
from .writer import ShardWriter, done_meta

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif"}
PARAMS = "convert.json"


@dataclass
class Shard:
    """One shard to write: ``fill(writer)`` adds its samples."""

    split: str
    name: str
    fill: Callable[[ShardWriter], None]


def convert(src: str, dst: str, comm, *, split: str = "train", parse: str | None = None,
            decode: str | None = None, image_size: str = "64x64", shard_size: int = 8192,
            overwrite: bool = False, say=print) -> dict | None:
    """Convert ``src`` into the dataset directory ``dst`` on every rank of ``comm``; rank 0
    writes and returns the manifest (None elsewhere)."""
    shards, info = _inputs(src, split, parse, decode, image_size, shard_size)
    params = {"src": str(Path(src).resolve()) if Path(src).exists() else src, "split": split,
              "parse": parse, "decode": info.get("decode"), "shard_size": shard_size}
    error = _prepared(Path(dst), params, overwrite) if comm.rank == 0 else None
    error = comm.bcast(error, root=0)
    if error:
        raise InputFileError(error, field="dst")
    t0, mine = time.perf_counter(), shards[comm.rank::comm.size]
    for shard in mine:
        if done_meta(Path(dst), shard.split, shard.name) is None:
            writer = ShardWriter(Path(dst), shard.split, shard.name)
            shard.fill(writer)
            writer.close()
        if comm.rank == 0:
            _progress(Path(dst), shards, t0, say)
    comm.barrier()
    return _manifest(Path(dst), shards, info) if comm.rank == 0 else None


def _prepared(dst: Path, params: dict, overwrite: bool) -> str | None:
    """``dst`` ready for this conversion (made, cleared with ``overwrite``, or the same
    conversion resumed), else why not."""
    if dst.exists() and not dst.is_dir():
        return f"{dst} is a file"
    ours = dst / PARAMS
    if dst.is_dir() and any(dst.iterdir()):
        if overwrite:
            shutil.rmtree(dst)
        elif (dst / "manifest.json").exists():
            return f"{dst} holds a converted dataset already; give --overwrite to replace it"
        elif not ours.is_file():
            return f"{dst} is not empty and not a conversion of hetgrad's; choose another"
        elif json.loads(ours.read_text()) != params:
            return (f"{dst} holds an unfinished conversion with other settings "
                    f"({ours.read_text()}); give --overwrite to start again")
    dst.mkdir(parents=True, exist_ok=True)
    write_json(params, ours)
    return None


def _progress(dst: Path, shards: list[Shard], t0: float, say) -> None:
    done = [m for s in shards if (m := done_meta(dst, s.split, s.name)) is not None]
    samples = sum(m["count"] for m in done)
    say(f"hetgrad: convert: {len(done)}/{len(shards)} shards, {samples} samples, "
        f"{samples / max(time.perf_counter() - t0, 1e-9):.0f} samples/s", flush=True)


def _manifest(dst: Path, shards: list[Shard], info: dict) -> dict:
    """Every shard's meta gathered into ``manifest.json`` (the fields checked alike)."""
    splits: dict = {}
    for shard in shards:
        meta = done_meta(dst, shard.split, shard.name)
        split = splits.setdefault(shard.split, {"count": 0, "fields": meta["fields"],
                                                "shards": []})
        if meta["fields"] != split["fields"]:
            raise InputFileError(f"{dst / shard.split / shard.name}: fields {meta['fields']}, "
                                 f"other shards {split['fields']}", field="src")
        split["count"] += meta["count"]
        split["shards"].append({k: meta[k] for k in ("name", "count", "sha256")})
    manifest = {"format": FORMAT, **info, "splits": splits}
    manifest.setdefault("classes", _classes(dst, splits))
    write_json(manifest, dst / "manifest.json")
    (dst / PARAMS).unlink(missing_ok=True)
    return manifest


def _classes(dst: Path, splits: dict) -> int:
    """1 + the largest integer label of every split (0 for labels that are not classes)."""
    top = -1
    for split, info in splits.items():
        if info["fields"].get("y", {}).get("dtype", "f")[1] not in "iu":
            return 0
        for shard in info["shards"]:
            labels = np.load(dst / split / shard["name"] / "y.npy", mmap_mode="r")
            top = max(top, int(labels.max()) if len(labels) else -1)
    return top + 1


def _inputs(src: str, split: str, parse, decode, image_size: str,
            shard_size: int) -> tuple[list[Shard], dict]:
    path = Path(src)
    if path.suffix == ".npz" and path.is_file():
        return _npz(path, shard_size)
    if path.is_dir() and any(p.is_dir() for p in path.iterdir()):
        return _images(path, split, image_size, shard_size)
    files = sorted(glob.glob(src)) if not path.is_dir() else sorted(map(str, path.iterdir()))
    if files and parse:
        return _tfrecords(files, split, parse, decode)
    if files:
        raise InputFileError(f"{src}: TFRecord files need --parse module:function (one "
                             "serialized example -> (features, label))", field="parse")
    raise InputFileError(f"{src}: not a .npz file, an image folder (a sub-folder per class) or "
                         "a TFRecord glob", field="src")


def _npz(path: Path, shard_size: int) -> tuple[list[Shard], dict]:
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in NPZ_KEYS if k in f.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InputFileError(f"cannot read {path} as .npz: {exc}", field="src") from None
    missing = [k for k in NPZ_KEYS if k not in arrays]
    if missing:
        raise InputFileError(f"{path} lacks arrays {missing}", field="src")
    check_arrays(path, arrays, "src")
    shards = []
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], np.asarray(arrays[f"y_{split}"]).astype(np.int64).ravel()
        for i, lo in enumerate(range(0, len(y), shard_size)):
            part = slice(lo, lo + shard_size)
            shards.append(Shard(split, f"shard-{i:05d}", lambda w, part=part, x=x, y=y:
                                w.add_block({"x": x[part], "y": y[part]})))
    x = arrays["x_train"]
    info = {"features": "x", "label": "y",
            "input_shape": list(x.shape[1:]) + ([1] if x.ndim == 3 else []),
            "classes": int(max(arrays["y_train"].max(), arrays["y_test"].max())) + 1,
            "scale": {s: float(arrays[f"x_{s}"].max()) or 1.0 for s in ("train", "test")}}
    return shards, info


def _images(folder: Path, split: str, image_size: str,
            shard_size: int) -> tuple[list[Shard], dict]:
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    files = [(f, label) for label, c in enumerate(classes) for f in sorted((folder / c).iterdir())
             if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise InputFileError(f"{folder}: no image files ({sorted(IMAGE_SUFFIXES)}) in its "
                             "class folders", field="src")

    def fill(writer: ShardWriter, part: list) -> None:
        from .decode import decode_image
        for f, label in part:
            data = f.read_bytes()
            try:   # every record decodes (training never meets one that does not)
                decode_image(data, 1, 1)
            except Exception as exc:   # noqa: BLE001 - TF's decode error, whatever its class
                raise InputFileError(f"{f}: not an image that decodes ({type(exc).__name__})",
                                     field="src") from None
            writer.add({"x": data, "y": np.int64(label)}, str(f))

    height, width = (int(v) for v in image_size.lower().split("x"))
    shards = [Shard(split, f"shard-{i:05d}", lambda w, part=files[lo:lo + shard_size]:
                    fill(w, part)) for i, lo in enumerate(range(0, len(files), shard_size))]
    return shards, {"features": "x", "label": "y", "input_shape": [height, width, 3],
                    "classes": len(classes), "class_names": classes,
                    "decode": f"image:{height}x{width}"}


def _tfrecords(files: list[str], split: str, parse: str,
               decode: str | None) -> tuple[list[Shard], dict]:
    import tensorflow as tf
    from .decode import decoder, user_function
    fn = user_function(parse)

    def fill(writer: ShardWriter, path: str) -> None:
        parsed = iter(tf.data.TFRecordDataset(path).map(fn, num_parallel_calls=tf.data.AUTOTUNE)
                      .prefetch(256))   # traced, in parallel: parsing one by one is the limit
        for i in itertools.count():
            try:
                features, label = next(parsed)
            except StopIteration:
                return
            except Exception as exc:   # noqa: BLE001 - the user's parse function failed
                raise InputFileError(f"{path} record {i}: --parse failed: {exc}",
                                     field="parse") from None
            writer.add({"x": features.numpy(), "y": np.asarray(label)}, f"{path} record {i}")

    first = next(iter(tf.data.TFRecordDataset(files[0])), None)
    if first is None:
        raise InputFileError(f"{files[0]} holds no records", field="src")
    sample = fn(first)
    if decode:
        sample = decoder(decode)(*sample)
    shape = list(np.asarray(sample[0]).shape)
    shards = [Shard(split, f"shard-{i:05d}", lambda w, p=p: fill(w, p))
              for i, p in enumerate(files)]
    return shards, {"features": "x", "label": "y", "input_shape": shape, "decode": decode}
