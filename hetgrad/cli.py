"""The ``hetgrad`` command line: probe | plan | train | demo | report.

The options of ``train``, ``probe`` and ``plan`` are generated from :class:`TrainConfig`'s
fields (help, choices, defaults), so the two cannot drift; errors the library raises about a
setting are shown with that command's flag for it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import click

from . import quiet
from .config import SETTINGS, TrainConfig, check_value, parse_settings
from .errors import ConfigError, HetgradError

PROBE_OPTIONS = ("data", "model", "loss", "emulate_speeds", "emulate_unit", "threads", "device",
                 "global_batch", "max_batch", "probe_batch", "probe_sizes", "probe_steps",
                 "probe_refine", "probe_timeout", "out")
PROBE_OVERRIDES = {"out": dict(default="probe.json", help="where rank 0 writes the results")}
PLAN_OPTIONS = ("speeds", "probe_file", "global_batch", "data", "min_batch", "max_batch",
                "drop_remainder", "out")
PLAN_OVERRIDES = {"probe_file": dict(flag="--probe", help="probe.json from `hetgrad probe`"),
                  "global_batch": dict(default=None, required=True),
                  "data": dict(default=None, help="dataset whose training size to use"),
                  "out": dict(default=None, help="save the plan as JSON")}


def flag_of(name: str, overrides: dict | None = None) -> str:
    """The flag of setting ``name`` on a command with these ``overrides``."""
    return ((overrides or {}).get(name, {}).get("flag") or SETTINGS[name].metadata["flag"]
            or "--" + name.replace("_", "-"))


def _kind_of(f) -> type:
    """The click type of a setting: its default's type, or for ``X | None`` settings X."""
    if f.metadata["parse"]:
        return str
    if f.default is not None:
        return type(f.default)
    return {"int": int, "float": float}.get(str(f.type).split("|")[0].strip(), str)


def _option(name: str, overrides: dict):
    f, extra = SETTINGS[name], dict(overrides.get(name, {}))
    extra.pop("flag", None)
    meta = f.metadata
    help_text = extra.pop("help", meta["help"])
    if meta["choices"]:
        help_text += f" ({' | '.join(meta['choices'])})"
    default = extra.pop("default", f.default)
    decls = [flag_of(name, overrides), *([meta["short"]] if meta["short"] else []), name]
    if isinstance(f.default, bool):
        return click.option(*decls, is_flag=True, default=default, help=help_text)
    kind = _kind_of(f)
    return click.option(*decls, type=kind, default=default, show_default=default is not None,
                        help=help_text, **extra)


def config_options(names, overrides: dict | None = None):
    """Decorator adding one click option per :class:`TrainConfig` field in ``names``."""
    def decorate(fn):
        for name in reversed(names):
            fn = _option(name, overrides or {})(fn)
        return fn
    return decorate


def _run(fn, flags: dict[str, str], *args):
    """Run a command body under fail_fast (clear one-line error, all ranks end)."""
    from .runtime import fail_fast
    with fail_fast(flags):
        return fn(*args)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--verbose", "-v", is_flag=True,
              help="show TensorFlow's start-up and warning lines on every rank")
def main(verbose: bool) -> None:
    """Heterogeneous data-parallel training on Horovod. Launch `train`/`probe` with mpirun."""
    if verbose:  # TensorFlow is not imported yet: it reads these when it is
        os.environ["HETGRAD_VERBOSE"] = "1"
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        quiet.uninstall()


@main.command()
@config_options(PROBE_OPTIONS, PROBE_OVERRIDES)
def probe(**values):
    """Measure every rank's step time at several batch sizes and fit its model (under mpirun)."""
    def body():
        from .validate import checked_probe
        cfg = TrainConfig(**parse_settings(values))
        checked = checked_probe(cfg)       # every check that needs no TensorFlow
        from . import preempt, probe as probe_mod
        from .runtime import init
        from .trainer import probe_ranks
        with preempt.listening():
            results = probe_ranks(checked)
            comm = init()
            stop = any(comm.allgather(preempt.requested()))
        if comm.rank == 0:
            probe_mod.save(results, cfg.out)
            click.echo(f"hetgrad: probe -> {cfg.out}", err=True)
            for r in results:
                at_plan = (f", x{r.scale:.3f} at its planned batch {r.plan_points[-1][0]}"
                           if r.plan_points else "")
                click.echo(f"rank {r.rank} {r.host} {r.device}: {r.samples_per_s:.1f} samples/s, "
                           f"{1e3 * r.fixed_s:.2f} ms fixed per step ({r.kind}, fit error "
                           f"{100 * r.fit_error:.1f}%{at_plan})")
        if stop:  # the results are saved; the job script requeues on this exit code
            if comm.rank == 0:
                click.echo(f"hetgrad: {preempt.STOP_SIGNAL.name} during the probe; exit "
                           f"{preempt.EXIT_REQUEUE}", err=True)
            sys.exit(preempt.EXIT_REQUEUE)
    _run(body, {n: flag_of(n, PROBE_OVERRIDES) for n in PROBE_OPTIONS})


@main.command()
@config_options(PLAN_OPTIONS, PLAN_OVERRIDES)
@click.option("--dataset-size", type=int, default=None, help="training samples (or give --data)")
def plan(dataset_size, **values):
    """Partition a global batch and a dataset by speed (no MPI needed)."""
    def body():
        from .partition import make_plan
        v = parse_settings(values)
        for name, value in v.items():
            check_value(name, value)
        if v["out"]:
            from .writable import check_writable
            check_writable(v["out"], "out")
        if (v["speeds"] is None) == (v["probe_file"] is None):
            raise ConfigError("give exactly one of --speeds and --probe", field="speeds")
        if v["probe_file"]:
            from .probe import load
            speeds = [r.model() for r in load(v["probe_file"])]
        else:
            speeds = v["speeds"]
        n = dataset_size
        if n is None:
            if v["data"] is None:
                raise ConfigError("give --dataset-size or --data", field="dataset_size")
            from .data import load as load_data
            n = len(load_data(v["data"]).train)
        p = make_plan(speeds, v["global_batch"], n, min_batch=v["min_batch"],
                      max_batch=v["max_batch"], drop_remainder=v["drop_remainder"])
        if v["out"]:
            p.save(v["out"])
            click.echo(f"hetgrad: plan -> {v['out']}", err=True)
        click.echo(json.dumps({k: x for k, x in p.to_dict().items() if k != "meta"}))
    _run(body, {n: flag_of(n, PLAN_OVERRIDES) for n in PLAN_OPTIONS})


@main.command()
@config_options(tuple(SETTINGS))
def train(**values):
    """Probe, plan and train (run under mpirun / srun; rank 0 prints and writes --out)."""
    def body():
        from .validate import checked_train
        checked = checked_train(TrainConfig(**parse_settings(values)))  # before TensorFlow
        from .trainer import train as run_train
        run_train(checked)
    _run(body, {n: flag_of(n) for n in SETTINGS})


def mpirun_command(np_: int, args: list[str], mpirun_args: list[str] = ()) -> list[str]:
    """``mpirun`` line that runs ``python -m hetgrad.cli ARGS`` on ``np_`` local ranks
    (``mpirun_args``: more options for mpirun, e.g. ``--mca btl self,tcp``)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise HetgradError("mpirun not found on PATH (install openmpi-bin: scripts/setup.sh)")
    cmd = [mpirun, "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + list(mpirun_args) + [sys.executable, "-m", "hetgrad.cli", *args]


@main.command()
@click.option("--np", "np_", default=3, show_default=True, type=int, help="ranks to launch")
@click.option("--emulate-speeds", default="1,2,4", show_default=True)
@click.option("--epochs", default=15, show_default=True, type=int)
@click.option("--out", default="demo.json", show_default=True)
def demo(np_, emulate_speeds, epochs, out):
    """Launch NP local ranks with emulated unequal speeds on the embedded digits data."""
    def body():
        cmd = mpirun_command(np_, ["train", "--emulate-speeds", emulate_speeds,
                                   "--epochs", str(epochs), "--out", out])
        click.echo("hetgrad demo: " + " ".join(cmd), err=True)
        sys.exit(subprocess.call(cmd))
    _run(body, {})


@main.command()
@click.argument("runs", nargs=-1, required=True)
@click.option("--out-dir", default="report", show_default=True,
              help="where table.md, summary.json and the PNG plots go")
def report(runs, out_dir):
    """Markdown table (mean ± std over seeds) and plots from `train` records."""
    def body():
        from .report import report as make_report
        md, pngs = make_report(runs, out_dir)
        click.echo(md)
        click.echo(f"hetgrad: report -> {out_dir}/table.md, {out_dir}/summary.json, "
                   f"{len(pngs)} plot(s): {' '.join(str(p) for p in pngs)}", err=True)
    _run(body, {"runs": "RUN.json", "out_dir": "--out-dir"})


@main.group("data")
def data_group() -> None:
    """Datasets larger than memory: convert what you have into record files read by index."""


@data_group.command()
@click.argument("src")
@click.argument("dst")
@click.option("--split", type=click.Choice(["train", "test"]), default="train",
              show_default=True, help="which split SRC is (a .npz gives both)")
@click.option("--parse", default=None,
              help="TFRecord SRC: module:function, one serialized example -> (features, label)")
@click.option("--decode", default=None, help="what a stored record becomes for the model: "
              "module:function(features, label) -> (features, label), or image:HxW")
@click.option("--image-size", default="64x64", show_default=True,
              help="image folder SRC: images are decoded and resized to this when read")
@click.option("--shard-size", type=int, default=8192, show_default=True,
              help="samples per shard (.npz, image folder; TFRecord: a shard per file)")
@click.option("--overwrite", is_flag=True, help="replace a dataset or conversion at DST")
def convert(src, dst, **options):
    """Convert SRC (a .npz, a TFRecord glob, an image folder) into the dataset directory DST
    (run it under mpirun to split the work over the ranks)."""
    def body():
        from .data.convert import convert as run
        from .runtime import control
        manifest = run(src, dst, control(), say=lambda text, **_: click.echo(text, err=True),
                       **options)
        if manifest:
            counts = {k: v["count"] for k, v in manifest["splits"].items()}
            click.echo(f"hetgrad: data convert -> {dst}: {counts} samples", err=True)
    _run(body, {"src": "SRC", "dst": "DST", "parse": "--parse", "decode": "--decode"})


if __name__ == "__main__":
    main()
