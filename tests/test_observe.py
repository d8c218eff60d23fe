"""--tensorboard and --timeline in parts: which steps the timeline keeps (and that a long run's
file stays small), the trace's events and clock alignment, the scalars of an epoch, the event
files read back by TensorBoard's reader (the report's PNG: test_report.py). On real ranks:
test_rebalance.py (a re-plan on the timeline), test_checkpoint.py (dense and sparse, and
observing changes no weight) and test_fit.py (hk.fit)."""
import json

import pytest

from hetgrad.rebalance import EpochBalance
from hetgrad.scalars import epoch_scalars, new_run_dir
from hetgrad.timeline import Sampler, Trace, clock_offsets, png
from observed import load_trace, only_run, read_scalars


def sampled(sampler: Sampler, epochs: int, steps: int) -> list[tuple[int, int]]:
    kept = []
    for e in range(epochs):
        sampler.begin_epoch(0, steps)
        kept += [(e, s) for s in range(steps) if sampler.wants(range(s, s + 1))]
    return kept


def test_sampler_keeps_the_first_steps_then_a_window_mid_epoch():
    kept = sampled(Sampler(first=25, window=4, windows=100), epochs=5, steps=10)
    assert kept[:25] == [(e, s) for e in range(3) for s in range(10)][:25]
    # then steps 3..6 (the middle) of every epoch; epoch 2's window falls inside the first 25
    assert kept[25:] == [(2, 5), (2, 6), (3, 3), (3, 4), (3, 5), (3, 6),
                         (4, 3), (4, 4), (4, 5), (4, 6)]


def test_a_resumed_epochs_window_lies_in_its_remaining_steps():
    s = Sampler(first=0, window=4)
    s.begin_epoch(8, 10)
    assert list(s.span) == [8, 9]


def test_a_split_epochs_rest_numbers_its_steps_on_from_the_first_fits_last():
    """200 steps at B_0 planned, split after 28; the rest runs steps 7..49 of a plan of 50:
    the timeline and the user's callbacks count them 28..70 (no key twice in the trace),
    also after a resume inside them; its window moves into them, and the rest is no epoch
    more (windows thin out by epochs)."""
    from hetgrad.run import Progress
    progress = Progress(plan=None, first_step=0)
    assert progress.counted(200) == (0, 200)
    s = Sampler(first=0, window=4)
    s.begin_epoch(0, 200)
    assert list(s.span) == [98, 99, 100, 101] and s.epochs == 1
    progress.split_step, progress.continue_step = 28, 7
    progress.first_step = progress.go_on()            # as the loop starts the rest
    assert progress.continued and progress.counted(50) == (28, 71)
    s.begin_epoch(*progress.counted(50), rest=True)
    assert list(s.span) == [47, 48, 49, 50] and s.epochs == s.taken == 1
    progress.first_step = 7 + 5                       # resumed 5 steps into the rest
    assert progress.counted(50) == (33, 71)
    skipped = Sampler(first=0, window=4, windows=1)
    skipped.begin_epoch(0, 200)
    skipped.begin_epoch(0, 200)                       # every 2nd epoch now: no window
    skipped.begin_epoch(*progress.counted(50), rest=True)
    assert not skipped.span and skipped.epochs == 2


def test_a_call_of_several_steps_is_kept_when_one_of_them_is_wanted():
    s = Sampler(first=3, window=2)
    s.begin_epoch(0, 12)                      # window: steps 5, 6
    calls = [range(i, min(i + 4, 12)) for i in range(0, 12, 4)]
    assert [s.wants(c) for c in calls] == [True, True, False]   # the first 3; step 5 or 6


def test_windows_thin_out_so_a_long_run_stays_megabytes():
    s = Sampler(first=100, window=10, windows=100)
    kept = sampled(s, epochs=20_000, steps=50)
    # a window every epoch for 100 windows, then every 2nd for 100 more, every 4th, ...:
    # 100 * log2(E / 100) windows -- 757 here, 7 strides and part of the 8th
    assert s.taken == 757 and len(kept) == 100 + 10 * (757 - 2)   # 2 inside the first 100
    assert sum(1 for e, _ in kept if e >= 10_000) < 10 * 100      # the last half: 1 in 128
    # the trace of 4 ranks: a few megabytes
    trace = Trace("unused.json", 4)
    for r in range(4):
        spans = [(e + 1, st, e + st * 0.01, e + st * 0.01 + 0.006, e + st * 0.01 + 0.009)
                 for e, st in kept]
        trace.add(r, spans, (1, 0.0, 20_000.0))
    size = len(json.dumps({"traceEvents": trace.events()}, separators=(",", ":")))
    assert size < 8e6, size


@pytest.mark.parametrize("skew", [5.0, -5.0])   # rank 1's clock ahead, behind
def test_trace_events_one_track_per_rank_skew_corrected(tmp_path, skew):
    trace = Trace(tmp_path / "t.json", 2)
    trace.add(0, [(1, 0, 100.0, 100.2, 100.5), (1, 1, 100.5, 100.6, 101.0)], (1, 99.9, 101.1))
    trace.add(1, [(1, 0, 100.0 + skew, 100.4 + skew, 100.5 + skew),
                  (1, 1, 100.5 + skew, 100.9 + skew, 101.0 + skew)], (1, 99.95 + skew, 101.1 + skew))
    trace.mark("re-plan", 101.05, epoch=1, batches=[4, 4], new_batches=[6, 2])
    trace.mark("checkpoint", 101.0, dur=0.05, epoch=1)
    assert clock_offsets(trace.steps) == pytest.approx([0.0, skew])
    trace.write(force=True)
    got = load_trace(tmp_path / "t.json", 2)
    compute = {r: [(ts, dur) for name, ts, dur, _ in got["steps"][r] if name == "compute"]
               for r in (0, 1)}
    assert compute[0] == [(100_000.0, 200_000.0), (600_000.0, 100_000.0)]   # us from 99.9 s
    assert compute[1] == [(100_000.0, 400_000.0), (600_000.0, 400_000.0)]   # skew gone
    exchange_end = {r: [ts + dur for name, ts, dur, _ in got["steps"][r] if name == "exchange"]
                    for r in (0, 1)}
    assert exchange_end[0] == pytest.approx(exchange_end[1])
    names = {m["name"]: m for m in got["markers"]}
    assert names["re-plan"]["args"]["new_batches"] == [6, 2] and names["re-plan"]["ph"] == "i"
    assert names["checkpoint"]["dur"] == pytest.approx(50_000.0)
    summary = trace.summary()
    assert summary["replanned_after"] == [1]
    assert summary["steps"][0]["ranks"][1] == pytest.approx([0.1, 0.5, 0.6])
    assert png(summary).startswith(b"\x89PNG")


def balance(replanned=False) -> EpochBalance:
    return EpochBalance(epoch=3, busy_s=[1.0, 4.0], wait_s=[3.0, 0.1],
                        measured_samples_per_s=[100.0, 10.0], measured_step_s=[0.1, 0.4],
                        predicted_step_s=[0.1, 0.2], imbalance=0.6, batches=[10, 4],
                        replanned=replanned, new_batches=[12, 2] if replanned else None,
                        predicted_gain=0.5)


def test_epoch_scalars_of_the_run_and_of_every_rank():
    row = {"epoch": 3, "loss": 0.5, "accuracy": 0.8, "test_accuracy": 0.75, "time_s": 4.1,
           "busy_s": 1.0, "wait_s": 3.0, "batches": [10, 4], "density": 0.01}
    run, ranks = epoch_scalars(row, balance(replanned=True), 14, 0.05)
    assert run == {"epoch/loss": 0.5, "epoch/accuracy": 0.8, "epoch/test_accuracy": 0.75,
                   "epoch/time_s": 4.1, "epoch/density": 0.01, "plan/global_batch": 14.0,
                   "optimizer/learning_rate": 0.05, "balance/imbalance": 0.6,
                   "plan/replanned": 1.0, "plan/predicted_gain": 0.5}
    assert ranks[1] == {"rank/batch": 4.0, "rank/busy_s": 4.0, "rank/wait_s": 0.1,
                        "rank/step_measured_s": 0.4, "rank/step_predicted_s": 0.2,
                        "rank/samples_per_s": 10.0}
    run, ranks = epoch_scalars(row, None, 14, None)   # a partial epoch: not measured
    assert ranks == [] and "balance/imbalance" not in run
    run, _ = epoch_scalars({"b_noise_interval": [120.0, None]}, None, 14, None)
    assert run["epoch/b_noise_low"] == 120.0 and "epoch/b_noise_high" not in run
    run, _ = epoch_scalars({"b_noise_interval": [120.0, 300.0]}, None, 14, None)
    assert run["epoch/b_noise_high"] == 300.0


def test_scalars_read_back_by_tensorboard(tmp_path):
    from hetgrad.scalars import ScalarWriter
    writer = ScalarWriter(tmp_path, 2)
    for epoch in (1, 2):
        writer.write(epoch, *epoch_scalars({"loss": 1.0 / epoch}, balance(), 14, 0.1))
    writer.close()
    assert only_run(tmp_path) == writer.dir
    got = read_scalars(writer.dir)
    assert sorted(got) == ["", "rank0", "rank1"]
    assert got[""]["epoch/loss"] == [(1, 1.0), (2, 0.5)]
    assert got["rank1"]["rank/busy_s"] == [(1, 4.0), (2, 4.0)]
    assert got["rank0"]["rank/batch"] == [(1, 10.0), (2, 10.0)]


def test_every_run_gets_its_own_directory(tmp_path):
    a, b = new_run_dir(tmp_path, 0.0), new_run_dir(tmp_path, 0.0)
    assert a.name == "19700101-000000" and b.name == "19700101-000000-2"
