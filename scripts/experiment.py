#!/usr/bin/env python
"""Equal vs uneven-avg vs weighted: accuracy and time per epoch under unequal speeds.

Profiles: emulated speeds (``1,8``: a rank of speed s sleeps n x 1 ms / s per step of n
samples) or fixed CPU shares (``quota:1,0.25``: rank r on core r, capped at that share of it
by a cgroup quota, ``bench/placement.py``: real compute, needs root). Per task and profile,
every seed runs each mode once, the modes in a fresh random order every seed
(``bench/schedule.py``). Resumable: each run writes DIR/<task>_<profile>_<mode>_s<seed>.json
and is skipped when that file exists. At the end: ``hetgrad report``'s table and plots in
DIR/report (or ``--report-dir``), and the claim table (weighted - uneven-avg per cell with
its 95 % interval, ``bench/claim.py``) in DIR/claim.md and DIR/claim.json.

    .venv/bin/python scripts/experiment.py --dir results/claim
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.claim import cells, markdown
from bench.launch import train
from bench.placement import placed
from bench.schedule import interleaved

TASKS = {  # name: (train args, epochs)
    "digits-mlp": (["--data", "digits", "--model", "mlp", "--global-batch", "96"], 10),
    "mnist1d-cnn": (["--data", "mnist1d", "--model", "cnn1d", "--global-batch", "100",
                     "--optimizer", "adam", "--lr", "0.01"], 20),
    # compute-bound steps (1.1M weights, ~16 ms a step of 256 on a core): CPU shares show in
    # step times there, unlike in the two tiny tasks above
    "mnist1d-wide": (["--data", "mnist1d", "--model", "wide-mlp", "--global-batch", "256",
                      "--optimizer", "adam", "--lr", "0.001"], 20),
    "synthetic-cnn": (["--data", "synthetic", "--model", "cnn", "--global-batch", "128",
                       "--optimizer", "adam", "--lr", "0.002"], 4),
}


def profile_setup(profile: str) -> tuple[int, list[str], list | None]:
    """Ranks, extra train args and placement of a profile: ``1,8`` (emulated speeds) or
    ``quota:1,0.25`` (rank r on core r % 2 at that CPU share, >= 0.25)."""
    if profile.startswith("quota:"):
        shares = [float(s) for s in profile[len("quota:"):].split(",")]
        return len(shares), [], [(r % 2, s) for r, s in enumerate(shares)]
    return len(profile.split(",")), ["--emulate-speeds", profile], None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="results/claim")
    ap.add_argument("--profiles", default="1,8;1,1,2,4;quota:1,0.25",
                    help="';'-separated speed profiles")
    ap.add_argument("--modes", default="equal,uneven-avg,weighted")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tasks", default="digits-mlp,mnist1d-cnn")
    ap.add_argument("--epochs-scale", type=float, default=1.0)
    ap.add_argument("--report-dir", help="where the report goes (default DIR/report)")
    args = ap.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    for task in args.tasks.split(","):
        targs, epochs = TASKS[task]
        epochs = max(1, round(epochs * args.epochs_scale))
        for profile in args.profiles.split(";"):
            ranks, extra, placement = profile_setup(profile)
            name = profile.replace(",", "-").replace(":", "-")
            for seed, mode in interleaved(args.modes.split(","), args.seeds):
                f = out / f"{task}_{name}_{mode}_s{seed}.json"
                if f.exists():
                    continue
                print(f"[experiment] {f.name}", flush=True)
                part = f.with_name(f.name + ".part")
                with placed(placement) as wrap:
                    rec = train(ranks, [*targs, *extra, "--mode", mode, "--seed", str(seed),
                                        "--epochs", str(epochs)], part, wrap=wrap)
                rec["label"] = profile   # the record's profile, for the report's groups
                f.write_text(json.dumps(rec, indent=1))
                part.unlink()
    summarize(out, Path(args.report_dir or out / "report"))


def summarize(out: Path, report_dir: Path) -> None:
    """The report (in ``report_dir``) and the claim table (in ``out``) of every record in
    ``out``."""
    from hetgrad.report import load_runs, report
    paths = sorted(out.glob("*_s*.json"))
    md, pngs = report(paths, report_dir)
    rows = cells(load_runs(paths))
    (out / "claim.json").write_text(json.dumps(rows, indent=1))
    (out / "claim.md").write_text(markdown(rows))
    print(md + "\n" + markdown(rows))
    for p in pngs:
        print("plot:", p)


if __name__ == "__main__":
    main()
