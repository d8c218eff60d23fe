"""`hetgrad report`: grouping over seeds, speed-up against equal, plots written, bad files."""
import json
import os
import re
import subprocess
import sys

import pytest

from hetgrad.errors import HetgradError
from hetgrad.report import report


def record(mode, seed, epoch_time, acc):
    return {"config": {"model": "mlp", "data": "digits", "mode": mode, "seed": seed,
                       "emulate_speeds": "1,3"},
            "plan": {"speeds": [1, 3], "shard_sizes": [25, 75], "batches": [1, 3]},
            "probe": [{"samples_per_s": 100.0}, {"samples_per_s": 300.0}],
            "epochs": [{"test_accuracy": acc, "time_s": epoch_time}] * 2,
            "median_epoch_time_s": epoch_time, "samples_per_s": 100 / epoch_time,
            "throughput_efficiency": 100 / epoch_time / 400, "final_test_accuracy": acc,
            "best_test_accuracy": acc}


def test_report_groups_seeds_and_computes_speedup(tmp_path):
    files = []
    for mode, t in (("equal", 1.0), ("weighted", 0.5)):
        for seed, acc in enumerate((0.9, 0.8)):
            f = tmp_path / f"{mode}{seed}.json"
            f.write_text(json.dumps(record(mode, seed, t + 0.1 * seed, acc)))
            files.append(f)
    md, pngs = report(files, tmp_path / "out")
    rows = json.loads((tmp_path / "out/summary.json").read_text())
    by_mode = {r["mode"]: r for r in rows}
    assert by_mode["equal"]["seeds"] == 2
    assert by_mode["weighted"]["speedup_vs_equal"] == pytest.approx(1.05 / 0.55)
    # weighted: rank 0 busy 25/100 = 0.25 s of 0.5 s -> idle 0.5; rank 1 busy 0.25 s -> 0.5
    assert by_mode["weighted"]["mean_idle"][0] == pytest.approx(0.5)
    assert "| mlp/digits | 1,3 | weighted | 2 |" in md and "1.91x" in md
    assert len(pngs) == 1 and pngs[0].stat().st_size > 10_000


def test_report_draws_a_records_timeline(tmp_path):
    from hetgrad.timeline import Trace
    trace = Trace(tmp_path / "t.json", 2)
    for r in range(2):
        trace.add(r, [(1, s, s, s + 0.1 * (r + 1), s + 0.3) for s in range(5)], (1, 0.0, 5.0))
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**record("weighted", 0, 1.0, 0.9), "timeline": trace.summary()}))
    _, pngs = report([path], tmp_path / "report")
    drawn = tmp_path / "report" / "timeline_run.png"
    assert drawn in pngs and drawn.read_bytes().startswith(b"\x89PNG")


def test_report_rejects_non_records(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(HetgradError, match="x.json is not a `hetgrad train` record"):
        report([bad], tmp_path)


def test_sparse_report_budget_and_time_to_accuracy(monkeypatch):
    from conftest import ROOT
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from sparse_report import per_seed, summary

    def row(arm, seed, curve):
        return {"ranks": 4, "arm": arm, "seed": seed, "step_s": 1.0 if arm == "dense" else 0.25,
                "final_test_accuracy": curve[-1][1], "curve": curve}
    rows = [row("dense", 0, [[10, 0.8], [10, 0.9]]),              # 20 s, final 0.9
            row("sticky", 0, [[6, 0.7], [6, 0.895], [6, 0.95], [6, 0.6]])]
    dense, sticky = summary(rows)
    assert (dense["acc_at_dense_time"], dense["time_to_target_s"]) == (0.9, 20)
    # target 0.9 - 0.01: reached after 12 s; within dense's 20 s its last epoch ends at 18 s
    assert sticky["time_to_target_s"] == 12 and sticky["acc_at_dense_time"] == 0.95
    assert (sticky["epochs"], sticky["acc"], sticky["vs_dense"]) == (4, 0.6, 0.25)
    # seed by seed: epoch 1 s, training s, to target (0.89), to dense's accuracy (0.9), best,
    # final
    assert "| 4 | sticky | 0 | 6.0 | 24 | 12 | 18 | 0.950 | 0.600 |" in per_seed(rows, [dense, sticky])


def test_perfmodel_table_ratios_predicted_efficiency_and_churn(monkeypatch):
    """bench_perfmodel's table: ratios to the oracle per repeat, the efficiency the plan's own
    prediction gives (B / t_pred / sum s_i), and the churn rows."""
    from conftest import ROOT
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_perfmodel import (breakdown_markdown, ceiling_markdown, churn_markdown,
                                 gap_markdown, table)

    def run(sps, pred=None):
        return {"samples_per_s": sps, "efficiency": sps / 1000, "batches": [30, 70],
                "final_batches": [30, 70], "predicted_step_s": pred, "measured_step_s": 0.11,
                "sum_probed_samples_per_s": 1000.0, "steady_imbalance": 0.02,
                "replans_after_epoch_2": 0, "final_test_accuracy": 0.9}

    runs = {"equal": [run(400), run(500)], "affine": [run(900, 0.1), run(990, 0.125)],
            "oracle": [run(1000), run(900)]}
    t = table(runs)
    assert t["affine"]["ratios_over_oracle_per_repeat"] == pytest.approx([0.9, 1.1])
    assert t["affine"]["over_oracle"] == pytest.approx(945 / 950)
    assert t["affine"]["over_equal"] == pytest.approx(945 / 450)
    # 100 samples / 0.1 s / 1000 = 1.0, / 0.125 s = 0.8: median 0.9
    assert t["affine"]["predicted_efficiency_median"] == pytest.approx(0.9)
    assert t["affine"]["predicted_over_measured_step"] == pytest.approx((0.1 / 0.11 + 0.125 / 0.11) / 2)
    assert t["oracle"]["predicted_efficiency_median"] is None
    # per step: ideal 100/1000 s, predicted median 112.5 ms, busy 110 ms, 100 samples at
    # 900 and 990 samples/s -> median 106.1 ms (-3.6 %); efficiency median 0.945
    gap = gap_markdown({"scenarios": {"s": {"runs": runs}}}).splitlines()[-1]
    assert gap == ("| s | 100.0 ms | 112.5 ms (+12.5 %) | 110.0 ms (-2.2 %) "
                   "| 106.1 ms (-3.6 %) | 0.95 |")
    assert churn_markdown({}) == ""
    churn = {"churn": {"real": {"epochs": 6, "runs": [{
        "replanned_after_epochs": [1, 3], "replans_after_epoch_2": 1,
        "imbalance": [0.3, 0.2, 0.04, 0.02, 0.06, 0.03], "steady_imbalance": 0.035,
        "first_batches": [60, 30, 30], "final_batches": [58, 31, 31], "samples_per_s": 5000}]}}}
    row = churn_markdown(churn).splitlines()[-1]
    assert row == "| real | 0 | 6 | 1 (3) | 0.035 | 0.060 | [60, 30, 30] -> [58, 31, 31] | 5000 |"
    assert breakdown_markdown({}) == ""
    one = {"batches": [57, 455], "predicted_step_s": 0.1207, "busy_step_s": 0.1256,
           "wait_step_s": 0.0039, "epoch_step_s": 0.1298, "efficiency": 0.9012}
    row = breakdown_markdown({"breakdown": {"two ranks": one}}).splitlines()[-1]
    assert row == ("| two ranks | [57, 455] | 120.7 ms | 125.6 ms | 3.9 ms | 129.8 ms "
                   "| 0.901 |")
    # ceiling rows: each repeat's efficiency over the one process's of the same unit
    step = lambda eff: {"batches": [512], "ideal_step_s": 0.1, "epoch_step_s": 0.1 / eff,  # noqa: E731
                        "efficiency": eff}
    ceiling = {"ceiling": {
        "one": {"one_process": "one", "runs": [step(0.95), step(0.9)]},
        "two, unit 2e-3": {"one_process": "one", "runs": [step(0.76), step(0.81)]},
        "other": {"one_process": "other", "runs": [step(0.5), step(0.5)]}}}
    rows = ceiling_markdown(ceiling).splitlines()
    assert rows[3] == "| two, unit 2e-3 | [512] | 100.0 ms | 127.5 ms | 0.785 | 0.850 (0.800, 0.900) |"
    assert ceiling_markdown({}) == ""


def _affinity_and_cgroup(wrap: list[str], rank: int) -> tuple[str, str]:
    """What a rank started behind ``wrap`` sees: its allowed cores and its cpu cgroup."""
    probe = "import os; print(sorted(os.sched_getaffinity(0))); print(open('/proc/self/cgroup').read())"
    out = subprocess.run([*wrap, sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, "OMPI_COMM_WORLD_RANK": str(rank)}, check=True).stdout
    cores, _, groups = out.partition("\n")
    cpu = next((line for line in groups.splitlines() if re.search(r":(cpu|cpu,cpuacct):", line)),
               "")
    return cores, cpu


def test_perfmodel_placement_pins_ranks_and_caps_their_cpu(monkeypatch):
    """bench_perfmodel's rank wrapper: rank r runs on its core, in its own quota cgroup when it
    has a CPU share (quota = share x period), and the cgroups are gone afterwards."""
    from conftest import ROOT
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_perfmodel as bp
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    with bp.placed(None) as wrap:
        assert wrap is None
    with bp.placed([(0, None), (1, None)]) as wrap:
        assert _affinity_and_cgroup(wrap, 1)[0] == "[1]"
        assert _affinity_and_cgroup(wrap, 0)[0] == "[0]"
    if not os.access(bp.CPU_CGROUP, os.W_OK):
        pytest.skip(f"{bp.CPU_CGROUP} is not writable here (CPU shares need root, cgroup v1)")
    with bp.placed([(1, None), (0, 0.25)]) as wrap:
        group = bp.CPU_CGROUP / f"hetgrad-bench-{os.getpid()}" / "rank1"
        quota = int((group / "cpu.cfs_quota_us").read_text())
        assert quota == bp.QUOTA_PERIOD_US // 4
        cores, cpu = _affinity_and_cgroup(wrap, 1)
        assert cores == "[0]" and cpu.endswith(f"/hetgrad-bench-{os.getpid()}/rank1")
        assert not _affinity_and_cgroup(wrap, 0)[1].endswith("rank0")
    assert not group.parent.exists()
