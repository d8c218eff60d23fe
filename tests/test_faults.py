"""No hung ranks: a fault on one rank ends all ranks quickly with a message naming it."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import FAST_ABORT, MPI_DIR, ROOT, mpirun_cmd, run_mpi


@pytest.mark.parametrize("fault,needle", [
    ("raise", "hetgrad: error on rank 1/3: injected failure in the probe"),
    ("sleep", "hetgrad: error on rank 0/3: --probe-timeout: rank(s) [1] did not report within 5s"),
    # Open MPI names the rank that died (process [[job,1],1]) and its exit code
    ("exit", "Exit code:    3"),
])
def test_fault_on_one_rank_ends_the_job(fault, needle):
    t0 = time.monotonic()
    proc = run_mpi(3, [str(MPI_DIR / "faults.py"), fault], timeout=100, env_update=FAST_ABORT)
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert needle in out, out[-3000:]
    assert elapsed < 60, elapsed


# Faults in a real `hetgrad train` run, mid-training: each ends every rank within 60 s with a
# line naming the cause, and the checkpoint left behind resumes the run.

TRAIN = ["train", "--speeds", "1,1", "--epochs", "400", "--quiet", "--probe-steps", "1"]


def _start(tmp_path, extra=()):
    """`hetgrad train` on 2 ranks in the background, once its first checkpoint exists."""
    ckpt = tmp_path / "ckpt"
    cmd = mpirun_cmd(2, ["-m", "hetgrad.cli", *TRAIN, "--checkpoint-dir", str(ckpt),
                         "--out", str(tmp_path / "r.json"), *extra])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 120
    while not (ckpt / "state.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    return proc, ckpt


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    for pid in subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True,
                              text=True).stdout.split():
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(pid)
    raise AssertionError(f"rank {rank} not found under mpirun {launcher.pid}")


def _ended(proc: subprocess.Popen, t0: float) -> str:
    """The launcher's stderr once it ended (killed, with its ranks, after 90 s)."""
    try:
        _, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        for pid in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)   # e.g. a stopped rank nothing else ended
        proc.kill()
        _, err = proc.communicate()
    assert time.monotonic() - t0 < 60, (time.monotonic() - t0, err[-3000:])
    assert proc.returncode != 0
    return err


def _resumes(world2, tmp_path, ckpt) -> None:
    """The checkpoint the fault left behind resumes the run for one more epoch (what
    `hetgrad train ... --resume CKPT` runs, in a test world)."""
    epoch = json.loads((ckpt / "state.json").read_text())["epoch"]
    rec = world2.run("training:train", speeds=[1, 1], epochs=epoch + 1, quiet=True,
                     probe_steps=1, resume=str(ckpt), out=str(tmp_path / "resumed.json")).root
    assert len(rec["epochs"]) == 1


def test_sigterm_to_the_launcher(world2, tmp_path):
    proc, ckpt = _start(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    err = _ended(proc, t0)
    assert "stopped by SIGTERM" in err, err[-3000:]
    _resumes(world2, tmp_path, ckpt)


def test_rank_killed_mid_epoch(world2, tmp_path):
    proc, ckpt = _start(tmp_path)
    t0 = time.monotonic()
    os.kill(_rank_pid(proc, 1), signal.SIGKILL)
    err = _ended(proc, t0)
    assert "Signal: Killed" in err or "signal 9" in err, err[-3000:]
    _resumes(world2, tmp_path, ckpt)


def test_stuck_rank_hits_the_step_timeout(world2, tmp_path):
    proc, ckpt = _start(tmp_path, ["--step-timeout", "5"])
    t0 = time.monotonic()
    os.kill(_rank_pid(proc, 1), signal.SIGSTOP)
    err = _ended(proc, t0)
    assert "hetgrad: error on rank 0/2: --step-timeout: no progress for 5s" in err, err[-3000:]
    _resumes(world2, tmp_path, ckpt)


def test_sigusr1_checkpoints_at_the_next_step_and_exits_75(world2, tmp_path):
    """What Slurm's --signal=USR1@T sends before the time limit (mpirun forwards it): the
    ranks stop after the step where they agree on it, save there and exit 75."""
    proc, ckpt = _start(tmp_path)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 75, err[-3000:]
    state = json.loads((ckpt / "state.json").read_text())
    where = (f"at step {state['step']}/{state['plan']['steps_per_epoch']} of epoch "
             f"{state['epoch'] + 1}/400" if state["step"] else f"after epoch {state['epoch']}/400")
    assert f"hetgrad: stopped by SIGUSR1 {where}; checkpoint in {ckpt}" in err, err[-3000:]
    assert not (ckpt / "final_weights.npz").exists()
    _resumes(world2, tmp_path, ckpt)


def _sigusr1_during_the_probe(args: list[str]) -> subprocess.Popen:
    """Run ``hetgrad ARGS`` on 2 ranks (a slow emulated probe), send SIGUSR1 to the launcher
    once rank 0 says the probe has begun (so every rank listens), wait for the end."""
    cmd = mpirun_cmd(2, ["-m", "hetgrad.cli", *args, "--emulate-speeds", "1,1",
                         "--emulate-unit", "2e-3", "--probe-steps", "4"])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    for line in proc.stdout:
        if line.startswith("hetgrad: probe: timing"):
            break
    proc.send_signal(signal.SIGUSR1)
    proc.err = proc.communicate(timeout=120)[1]
    return proc


def test_sigusr1_during_the_probe_stops_train_after_the_first_step(tmp_path):
    """A stop request before training starts is kept, not fatal: the first step ends, its
    checkpoint is saved, exit 75 (Slurm's signal may come at any time)."""
    ckpt = tmp_path / "ckpt"
    proc = _sigusr1_during_the_probe(["train", "--epochs", "400", "--checkpoint-dir", str(ckpt),
                                      "--out", str(tmp_path / "r.json")])
    assert proc.returncode == 75, proc.err[-3000:]
    state = json.loads((ckpt / "state.json").read_text())
    assert (state["epoch"], state["step"]) == (0, 1), state
    assert (f"hetgrad: stopped by SIGUSR1 at step 1/{state['plan']['steps_per_epoch']} of "
            f"epoch 1/400; checkpoint in {ckpt}") in proc.err, proc.err[-3000:]


def test_sigusr1_during_hetgrad_probe_saves_it_and_exits_75(tmp_path):
    """train.sbatch's probe step: the probe finishes and is saved; exit 75 requeues the job."""
    out = tmp_path / "probe.json"
    proc = _sigusr1_during_the_probe(["probe", "--out", str(out)])
    assert proc.returncode == 75, proc.err[-3000:]
    assert "hetgrad: SIGUSR1 during the probe; exit 75" in proc.err
    assert len(json.loads(out.read_text())) == 2


class _World:
    rank, size = 0, 2

    def __init__(self, flags):
        self.flags = flags

    def allgather(self, mine):
        return self.flags


@pytest.mark.parametrize("flags,checkpoint_dir,expected", [
    ([(False, False), (False, True)], "ckpt", (False, True)),    # one rank asked: all stop
    ([(True, False), (False, False)], "ckpt", (True, False)),    # early stopping somewhere
    ([(False, True), (False, True)], None, (False, False)),      # nowhere to save: ignored
])
def test_ranks_agree_on_stopping(flags, checkpoint_dir, expected, capsys):
    from types import SimpleNamespace
    from hetgrad.loop import _agree_on_stopping
    job = SimpleNamespace(comm=_World(flags), rank=0, model=SimpleNamespace(stop_training=False),
                          checkpointer=SimpleNamespace(dir=checkpoint_dir))
    assert _agree_on_stopping(job) == expected
    assert ("SIGUSR1 ignored" in capsys.readouterr().err) == (checkpoint_dir is None)
