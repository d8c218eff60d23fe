"""Data at scale, measured (docs/results.md "Data at scale"; JSON -> --out):

- memory: per-rank peak RSS of `hetgrad train` (3 ranks, mlp) reading a record dataset of
  0.6 GB and of 6 GB (3 KB images), against the in-memory .npz path at 0.6 GB; each run
  sampled from /proc for --seconds, then stopped (an epoch of 2 M samples is not needed to
  reach the steady state);
- epoch: the demo's task (digits, 3 ranks, emulated speeds 1,2,4) from memory and from
  records, interleaved (a fresh random order every repeat: bench/schedule.py), --repeats
  each: epoch time, and the reader alone against what training consumes per rank;
- convert: 1 GB of TFRecord files (10 KB records) converted by 2 ranks, against one pass of
  reading them.

Usage: python scripts/bench_data.py [--only memory,epoch,convert] --work DIR --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import ROOT, records, results
from bench.launch import mpirun, run, train, train_cmd
from bench.schedule import interleaved
from hetgrad.data.records import FORMAT
from hetgrad.data.writer import ShardWriter

SAMPLE = (32, 32, 3)                       # 3 KB uint8 images, 10 classes


def synthetic_records(path: Path, gigabytes: float, shard: int = 16384) -> Path:
    """A dataset directory of ``gigabytes`` of random 32x32x3 images (kept if made before)."""
    if (path / "manifest.json").is_file():
        return path
    n = int(gigabytes * 1e9 / (np.prod(SAMPLE) + 8))
    splits = {}
    for split, count in (("train", n), ("test", 1000)):
        shards = []
        for i, lo in enumerate(range(0, count, shard)):
            rng = np.random.default_rng([i, count])
            m = min(shard, count - lo)
            w = ShardWriter(path, split, f"shard-{i:05d}")
            w.add_block({"x": rng.integers(0, 256, (m, *SAMPLE), np.uint8),
                         "y": rng.integers(0, 10, m).astype(np.int64)})
            shards.append(w.close())
        splits[split] = {"count": count, "fields": shards[0]["fields"],
                         "shards": [{k: s[k] for k in ("name", "count", "sha256")} for s in shards]}
    (path / "manifest.json").write_text(json.dumps({
        "format": FORMAT, "features": "x", "label": "y", "input_shape": list(SAMPLE),
        "classes": 10, "scale": {"train": 255.0, "test": 255.0}, "splits": splits}))
    return path


def synthetic_npz(path: Path, gigabytes: float) -> Path:
    if not path.is_file():
        n = int(gigabytes * 1e9 / np.prod(SAMPLE))
        rng = np.random.default_rng(0)
        np.savez(path, x_train=rng.integers(0, 256, (n, *SAMPLE), np.uint8),
                 y_train=rng.integers(0, 10, n), x_test=rng.integers(0, 256, (1000, *SAMPLE),
                                                                      np.uint8),
                 y_test=rng.integers(0, 10, 1000))
    return path


def _status(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024 ** 2     # GB
    return out


def _ranks(launcher: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def peak_memory(data: str, seconds: float, work: Path) -> dict:
    """Per-rank peaks (GB) of a 3-rank `hetgrad train` on ``data`` over ``seconds``."""
    cmd = train_cmd(3, ["--data", data, "--model", "mlp", "--speeds", "1,1,1", "--epochs", "1",
                        "--probe-steps", "2"], work / "memory-run.json")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peaks: dict[int, dict] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds and proc.poll() is None:
        for pid in _ranks(proc.pid):
            try:
                now = _status(pid)
            except OSError:
                continue
            mine = peaks.setdefault(pid, {})
            for k, v in now.items():
                mine[k] = max(mine.get(k, 0.0), v)
        time.sleep(0.5)
    ran = time.monotonic() - t0
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    return {"seconds": ran, "ranks": list(peaks.values()),
            "max_peak_rss_gb": max(p["VmHWM"] for p in peaks.values()),
            "max_anon_gb": max(p["RssAnon"] for p in peaks.values())}


def memory(work: Path, seconds: float) -> dict:
    out = {}
    for gb in (0.6, 6.0):
        data = synthetic_records(work / f"records-{gb:g}GB", gb)
        out[f"records {gb:g} GB"] = peak_memory(str(data), seconds, work)
        print(f"memory, records {gb:g} GB: {out[f'records {gb:g} GB']['max_peak_rss_gb']:.2f} GB",
              flush=True)
    npz = synthetic_npz(work / "arrays-0.6GB.npz", 0.6)
    out["npz 0.6 GB (in memory)"] = peak_memory(str(npz), seconds, work)
    return out


def epoch_times(work: Path, repeats: int) -> dict:
    """The demo's task from memory and from records, interleaved: median epoch seconds."""
    data = work / "digits-records"
    if not (data / "manifest.json").is_file():
        run([sys.executable, "-m", "hetgrad.cli", "data", "convert",
             str(ROOT / "hetgrad/datasets/digits.npz"), str(data)])
    arms = {"memory": "digits", "records": str(data)}
    runs: dict[str, list] = {arm: [] for arm in arms}
    for r, arm in interleaved(list(arms), repeats):
        rec = train(3, ["--data", arms[arm], "--emulate-speeds", "1,2,4", "--epochs", "8"],
                    work / f"epoch-{arm}-{r}.json")
        runs[arm].append({"epoch_s": records.epoch_s(rec), "samples_per_s": rec["samples_per_s"],
                          "batches": rec["plan"]["batches"]})
    med = {arm: statistics.median(x["epoch_s"] for x in v) for arm, v in runs.items()}
    return {"runs": runs, "median_epoch_s": med,
            "records_over_memory": med["records"] / med["memory"],
            "reader": reader_throughput(data, runs["records"])}


def reader_throughput(path: Path, runs: list) -> dict:
    """Each rank's slices read alone (one process, an epoch, 3 times) against what training
    consumed on that rank (its share of the run's samples/s)."""
    from hetgrad.data import load
    from hetgrad.data.reader import rank_batches
    from hetgrad.partition import fixed_plan
    source = load(str(path)).train
    batches = runs[0]["batches"]
    plan = fixed_plan(batches, len(source))
    out = []
    for rank, b in enumerate(batches):
        t0, n = time.perf_counter(), 0
        for epoch in range(3):
            for x, _ in rank_batches(source, plan, rank, 0, epoch):
                n += int(x.shape[0])
        read = n / (time.perf_counter() - t0)
        consumed = statistics.median(r["samples_per_s"] for r in runs) * b / sum(batches)
        out.append({"rank": rank, "read_samples_per_s": read,
                    "trained_samples_per_s": consumed, "headroom": read / consumed})
    return {"per_rank": out, "min_headroom": min(r["headroom"] for r in out)}


PARSE = ("import tensorflow as tf\n"
         "def parse(record):\n"
         "    f = tf.io.parse_single_example(record, {'x': tf.io.FixedLenFeature([], tf.string),\n"
         "                                             'y': tf.io.FixedLenFeature([], tf.int64)})\n"
         "    return f['x'], f['y']\n")


def tfrecords(work: Path, gigabytes: float, files: int = 8) -> Path:
    """``gigabytes`` of tf.train.Example records of 10 KB random bytes and a label."""
    import tensorflow as tf
    d = work / "tfrecords"
    if d.is_dir() and len(list(d.glob("*.tfrecord"))) == files:
        return d
    d.mkdir(parents=True, exist_ok=True)
    per_file = int(gigabytes * 1e9 / 10_240 / files)
    rng = np.random.default_rng(0)
    for k in range(files):
        with tf.io.TFRecordWriter(str(d / f"part-{k:03d}.tfrecord")) as w:
            for i in range(per_file):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[rng.bytes(10_240)])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10]))}))
                w.write(ex.SerializeToString())
    return d


def convert_time(work: Path, gigabytes: float) -> dict:
    import tensorflow as tf
    d = tfrecords(work, gigabytes)
    (work / "benchparse.py").write_text(PARSE)
    size = sum(p.stat().st_size for p in d.glob("*.tfrecord"))
    t0 = time.perf_counter()
    n = sum(1 for _ in tf.data.TFRecordDataset(sorted(map(str, d.glob("*.tfrecord")))))
    read_s = time.perf_counter() - t0
    out = work / "converted"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    t0 = time.perf_counter()
    run(mpirun(2, ["data", "convert", str(d / "*.tfrecord"), str(out),
                   "--parse", "benchparse:parse"]), cwd=work)
    convert_s = time.perf_counter() - t0
    return {"bytes": size, "records": n, "read_once_s": read_s, "convert_2_ranks_s": convert_s,
            "convert_mb_per_s": size / 1e6 / convert_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="memory,epoch,convert")
    ap.add_argument("--work", default="/tmp/hetgrad-bench-data")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/bench_data.json")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    result = results.load(out, {})
    for part in args.only.split(","):
        result[part] = {"memory": lambda: memory(work, args.seconds),
                        "epoch": lambda: epoch_times(work, args.repeats),
                        "convert": lambda: convert_time(work, 1.0)}[part]()
        results.save(result, out)
        print(f"{part}: done -> {out}", flush=True)


if __name__ == "__main__":
    main()
