"""The ``hetgrad`` command line: probe | plan | train | demo | report."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

from .errors import HetgradError


def _floats(flag: str, value: str | None) -> list[float] | None:
    if value is None:
        return None
    try:
        return [float(v) for v in value.split(",")]
    except ValueError:
        raise HetgradError(f"expected comma-separated numbers, got {value!r}", flag=flag) from None


def _ints(flag: str, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(v) for v in value.split(",")]
    except ValueError:
        raise HetgradError(f"expected comma-separated integers, got {value!r}", flag=flag) from None


def _run(fn, *args, **kwargs):
    """Run a command body under fail_fast (clear one-line error, all ranks end)."""
    from .runtime import fail_fast
    with fail_fast():
        return fn(*args, **kwargs)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Heterogeneous data-parallel training on Horovod. Launch `train`/`probe` with mpirun."""


common = [
    click.option("--data", default="digits", show_default=True,
                 help="digits (embedded), synthetic, or a Keras-format .npz path"),
    click.option("--model", default="mlp", show_default=True, help="mlp | cnn | resnet | wide-mlp"),
    click.option("--emulate-speeds", default=None,
                 help="emulated per-rank speeds, e.g. 1,2,4 or '1,2,4;3:1,0.5,4' (from epoch 3)"),
    click.option("--emulate-unit", default=1e-3, show_default=True, type=float,
                 help="emulated seconds per sample at speed 1"),
    click.option("--threads", default=1, show_default=True, type=int, help="TF threads per rank"),
    click.option("--device", default="cpu", show_default=True, help="cpu | gpu | auto"),
    click.option("--probe-batch", default=128, show_default=True, type=int),
    click.option("--probe-steps", default=8, show_default=True, type=int),
    click.option("--probe-timeout", default=300.0, show_default=True, type=float,
                 help="seconds rank 0 waits for every rank's probe before naming the missing"),
]


def with_common(fn):
    for opt in reversed(common):
        fn = opt(fn)
    return fn


@main.command()
@with_common
@click.option("--out", default="probe.json", show_default=True, help="where rank 0 writes results")
def probe(data, model, emulate_speeds, emulate_unit, threads, device, probe_batch, probe_steps,
          probe_timeout, out):
    """Measure every rank's training samples/s (run under mpirun)."""
    def body():
        from . import data as data_mod, models, probe as probe_mod
        from .emulate import SpeedEmulator, parse_schedule
        from .runtime import configure_tf, init
        comm = init()
        dev = configure_tf(threads, device)
        ds = data_mod.load(data)
        rank, size = comm.Get_rank(), comm.Get_size()
        sched = parse_schedule(emulate_speeds, size) if emulate_speeds else None
        pause = SpeedEmulator(sched[0][rank], emulate_unit).pause if sched else None
        res = probe_mod.run_probe(comm, lambda: models.build(model, ds.input_shape,
                                                             ds.num_classes),
                                  ds.input_shape, ds.num_classes, device=dev, batch=probe_batch,
                                  steps=probe_steps, before_step=pause,
                                  timeout=probe_timeout)
        if rank == 0:
            probe_mod.save(res, out)
            for r in res:
                click.echo(f"rank {r.rank} {r.host} {r.device}: {r.samples_per_s:.1f} samples/s")
    _run(body)


@main.command()
@click.option("--speeds", default=None, help="comma-separated per-rank speeds")
@click.option("--probe", "probe_file", default=None, help="probe.json from `hetgrad probe`")
@click.option("--global-batch", "-B", required=True, type=int)
@click.option("--dataset-size", type=int, default=None, help="training samples (or give --data)")
@click.option("--data", default=None, help="dataset whose training size to use")
@click.option("--min-batch", default=1, show_default=True, type=int)
@click.option("--max-batch", default=None, help="per-rank cap: one int or one per rank")
@click.option("--out", default=None, help="save the plan as JSON")
def plan(speeds, probe_file, global_batch, dataset_size, data, min_batch, max_batch, out):
    """Partition a global batch and a dataset by speed (no MPI needed)."""
    def body():
        from .partition import make_plan
        if (speeds is None) == (probe_file is None):
            raise HetgradError("give exactly one of --speeds and --probe", flag="--speeds")
        if probe_file:
            from .probe import load
            sp = [r.samples_per_s for r in load(probe_file)]
        else:
            sp = _floats("--speeds", speeds)
        n = dataset_size
        if n is None:
            if data is None:
                raise HetgradError("give --dataset-size or --data", flag="--dataset-size")
            from .data import load as load_data
            n = len(load_data(data).y_train)
        caps = _ints("--max-batch", max_batch)
        p = make_plan(sp, global_batch, n, min_batch=min_batch,
                      max_batch=caps[0] if caps and len(caps) == 1 else caps)
        if out:
            p.save(out)
        click.echo(json.dumps({k: v for k, v in p.to_dict().items() if k != "meta"}))
    _run(body)


@main.command()
@with_common
@click.option("--mode", default="weighted", show_default=True,
              type=click.Choice(["weighted", "uneven-avg", "equal"]),
              help="weighted: hetgrad; uneven-avg: uneven batches, Horovod average; equal: Horovod")
@click.option("--weighting", default="plan", show_default=True,
              type=click.Choice(["plan", "samples"]),
              help="weighted mode: the plan's per-step shares (exact, free) or counted samples")
@click.option("--global-batch", "-B", default=96, show_default=True, type=int)
@click.option("--epochs", default=10, show_default=True, type=int)
@click.option("--lr", default=0.05, show_default=True, type=float)
@click.option("--optimizer", default="sgd", show_default=True, type=click.Choice(["sgd", "adam"]))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--speeds", default=None, help="skip the probe's verdict: plan for these speeds")
@click.option("--plan", "plan_file", default=None, help="use a saved plan (from `hetgrad plan`)")
@click.option("--probe-file", default=None, help="reuse a saved probe instead of probing")
@click.option("--min-batch", default=1, show_default=True, type=int)
@click.option("--max-batch", default=None, help="per-rank batch cap: one int or one per rank")
@click.option("--sparsify", default=None, type=click.Choice(["topk", "recent", "sticky", "leader"]),
              help="send only top-k gradient entries, chosen by this policy")
@click.option("--density", default=0.01, show_default=True, type=float,
              help="fraction of each tensor's entries sent")
@click.option("--exchange", default="union", show_default=True,
              type=click.Choice(["allgather", "union"]))
@click.option("--dense-below", default=1024, show_default=True, type=int,
              help="tensors with fewer entries stay dense")
@click.option("--rebalance", is_flag=True,
              help="re-plan between epochs from each rank's measured busy time")
@click.option("--rebalance-threshold", default=0.05, show_default=True, type=float,
              help="re-plan when max(busy)/mean(busy) - 1 exceeds this")
@click.option("--on-nonfinite", default="abort", show_default=True,
              type=click.Choice(["abort", "ignore"]),
              help="NaN/Inf in a rank's local gradients: end the job naming the rank, or go on")
@click.option("--checkpoint-dir", default=None, help="rank 0 saves checkpoints here")
@click.option("--checkpoint-every", default=1, show_default=True, type=int, help="epochs")
@click.option("--resume", default=None, help="continue from this checkpoint dir")
@click.option("--out", default="run.json", show_default=True, help="JSON record (rank 0)")
@click.option("--quiet", is_flag=True, help="no progress lines")
def train(data, model, emulate_speeds, emulate_unit, threads, device, probe_batch, probe_steps,
          probe_timeout, mode, weighting, global_batch, epochs, lr, optimizer, seed, speeds,
          plan_file, probe_file, min_batch, max_batch, sparsify, density, exchange,
          dense_below, rebalance, rebalance_threshold, on_nonfinite, checkpoint_dir,
          checkpoint_every, resume, out, quiet):
    """Probe, plan and train (run under mpirun / srun; rank 0 prints and writes --out)."""
    def body():
        from .train import TrainConfig, train as run_train
        caps = _ints("--max-batch", max_batch)
        cfg = TrainConfig(data=data, model=model, mode=mode, weighting=weighting,
                          global_batch=global_batch, epochs=epochs, lr=lr, optimizer=optimizer,
                          seed=seed, speeds=_floats("--speeds", speeds), plan=plan_file,
                          emulate_speeds=emulate_speeds, emulate_unit=emulate_unit,
                          probe_batch=probe_batch, probe_steps=probe_steps,
                          probe_timeout=probe_timeout, probe_file=probe_file,
                          min_batch=min_batch,
                          max_batch=caps[0] if caps and len(caps) == 1 else caps,
                          sparsify=sparsify, density=density, exchange=exchange,
                          dense_below=dense_below, rebalance=rebalance,
                          rebalance_threshold=rebalance_threshold, on_nonfinite=on_nonfinite,
                          checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                          resume=resume, threads=threads, device=device, out=out,
                          verbose=not quiet)
        run_train(cfg)
    _run(body)


def mpirun_command(np_: int, args: list[str]) -> list[str]:
    """``mpirun`` line that runs ``python -m hetgrad.cli ARGS`` on ``np_`` local ranks."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise HetgradError("mpirun not found on PATH (install openmpi-bin: scripts/setup.sh)")
    cmd = [mpirun, "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + [sys.executable, "-m", "hetgrad.cli", *args]


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
    _run(body)


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
        for p in pngs:
            click.echo(f"plot: {p}")
    _run(body)


if __name__ == "__main__":
    main()
