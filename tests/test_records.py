"""Dataset directories of record files (hetgrad/data/records.py, convert.py): made from a .npz,
an image folder and TFRecord files; read by index exactly as the arrays they came from;
resumable conversion that never overwrites; and every way the files can be broken named in
one line before training."""
import json
import os

import numpy as np
import pytest

from conftest import ROOT, hetgrad_mpi
from hetgrad.comm import LocalComm
from hetgrad.data import digits, load
from hetgrad.data.convert import convert
from hetgrad.errors import InputFileError

DIGITS = ROOT / "hetgrad" / "datasets" / "digits.npz"


def quiet(*args, **kwargs):
    pass


def test_npz_converts_to_records_read_like_the_arrays(tmp_path):
    manifest = convert(str(DIGITS), str(tmp_path / "d"), LocalComm(), shard_size=500, say=quiet)
    assert [s["count"] for s in manifest["splits"]["train"]["shards"]] == [500, 500, 437]
    assert manifest["classes"] == 10 and manifest["input_shape"] == [8, 8, 1]
    rec, mem = load(str(tmp_path / "d")), digits()
    idx = np.random.default_rng(0).permutation(1437)[:300]
    for a, b in zip(rec.train.take(idx), mem.train.take(idx)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert len(rec.test) == 360 and rec.input_shape == (8, 8, 1) and rec.num_classes == 10
    assert not (tmp_path / "d" / "convert.json").exists()


def test_conversion_resumes_and_never_overwrites(tmp_path):
    d = tmp_path / "d"
    convert(str(DIGITS), str(d), LocalComm(), shard_size=500, say=quiet)
    with pytest.raises(InputFileError, match="holds a converted dataset already"):
        convert(str(DIGITS), str(d), LocalComm(), shard_size=500, say=quiet)
    # a conversion that stopped: no manifest, one shard missing; the same command finishes it
    (d / "manifest.json").unlink()
    (d / "convert.json").write_text(json.dumps({"src": str(DIGITS), "split": "train",
                                                "parse": None, "decode": None,
                                                "shard_size": 500}))
    kept = (d / "train/shard-00000/x.npy").stat().st_mtime_ns
    os.system(f"rm -r {d / 'train/shard-00001'}")
    convert(str(DIGITS), str(d), LocalComm(), shard_size=500, say=quiet)
    assert (d / "train/shard-00001/x.npy").is_file() and (d / "manifest.json").is_file()
    assert (d / "train/shard-00000/x.npy").stat().st_mtime_ns == kept   # not written again
    with pytest.raises(InputFileError, match="not empty and not a conversion of hetgrad's"):
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "notes.txt").write_text("mine")
        convert(str(DIGITS), str(tmp_path / "other"), LocalComm(), say=quiet)
    convert(str(DIGITS), str(d), LocalComm(), shard_size=700, overwrite=True, say=quiet)
    assert len(load(str(d)).train.shards) == 3


def _png(value: int) -> bytes:
    import tensorflow as tf
    return tf.io.encode_png(np.full((5, 7, 3), value, np.uint8)).numpy()


def test_image_folder_and_tfrecords_decode_when_read(tmp_path):
    import tensorflow as tf
    from hetgrad.data.reader import first_batch
    for c, value in (("cat", 10), ("dog", 200)):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "imgs" / c / f"{i}.png").write_bytes(_png(value))
    convert(str(tmp_path / "imgs"), str(tmp_path / "i"), LocalComm(), image_size="4x4",
            say=quiet)
    ds = load(str(tmp_path / "i"))
    assert ds.input_shape == (4, 4, 3) and ds.num_classes == 2 and len(ds.train) == 6
    x, y = first_batch(ds.train, 6)
    assert x.shape == (6, 4, 4, 3) and sorted(y.numpy()) == [0, 0, 0, 1, 1, 1]
    assert np.allclose(sorted(np.unique(np.round(x.numpy() * 255))), [10, 200])
    # TFRecords of tf.train.Example with the user's parse function, a shard per file
    (tmp_path / "parsing.py").write_text(
        "import tensorflow as tf\n"
        "def parse(record):\n"
        "    f = tf.io.parse_single_example(record, {'png': tf.io.FixedLenFeature([], tf.string),\n"
        "                                             'label': tf.io.FixedLenFeature([], tf.int64)})\n"
        "    return f['png'], f['label']\n")
    for k in range(2):
        with tf.io.TFRecordWriter(str(tmp_path / f"part-{k}.tfrecord")) as w:
            for i in range(4):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "png": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_png(9 * i)])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3]))}))
                w.write(ex.SerializeToString())
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        convert(str(tmp_path / "part-*.tfrecord"), str(tmp_path / "t"), LocalComm(),
                parse="parsing:parse", decode="image:3x3", say=quiet)
    finally:
        os.chdir(here)
    t = load(str(tmp_path / "t"))
    assert len(t.train) == 8 and len(t.train.shards) == 2 and t.num_classes == 3
    x, y = first_batch(t.train, 8)
    assert x.shape == (8, 3, 3, 3) and sorted(y.numpy().tolist()) == [0, 0, 0, 0, 1, 1, 2, 2]


def test_an_image_that_does_not_decode_is_named(tmp_path):
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    (tmp_path / "imgs" / "a" / "good.png").write_bytes(_png(5))
    (tmp_path / "imgs" / "a" / "bad.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(InputFileError, match=r"bad.png: not an image that decodes"):
        convert(str(tmp_path / "imgs"), str(tmp_path / "i"), LocalComm(), say=quiet)


def test_ranks_of_a_launch_share_the_conversion(tmp_path):
    """Under mpirun -np 2 each rank writes every other shard; the result is the same bytes."""
    convert(str(DIGITS), str(tmp_path / "one"), LocalComm(), shard_size=300, say=quiet)
    p = hetgrad_mpi(2, ["data", "convert", str(DIGITS), str(tmp_path / "two"),
                        "--shard-size", "300"], timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    one = json.loads((tmp_path / "one/manifest.json").read_text())
    two = json.loads((tmp_path / "two/manifest.json").read_text())
    assert one == two
