"""scripts/bench, the benchmarks' harness: arms interleaved in a random order per round
(reproducible by seed), resumable results, tables, one-line launch errors, and the
performance-model tools driven through it. No MPI launch, no TensorFlow."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from bench import claim, launch, records, results, schedule, tables  # noqa: E402

ARMS = ["horovod", "plan-checked", "plan-bare", "samples-checked", "float-bare"]


def test_every_round_is_a_permutation_and_the_seed_fixes_the_orders():
    orders = list(schedule.rounds(ARMS, 40, seed=7))
    assert len(orders) == 40 and all(sorted(o) == sorted(ARMS) for o in orders)
    assert orders == list(schedule.rounds(ARMS, 40, seed=7))
    assert orders != list(schedule.rounds(ARMS, 40, seed=8))
    # no arm keeps the same predecessor (what a fixed or turning order gives)
    before = {a: {o[i - 1] for o in orders for i in range(1, len(o)) if o[i] == a}
              for a in ARMS}
    assert all(len(prev) >= 3 for prev in before.values())
    flat = list(schedule.interleaved(ARMS, 40, seed=7))
    assert flat == [(r, a) for r, o in enumerate(orders) for a in o]


def test_the_overhead_benchmark_keeps_its_order():
    """bench_overhead drew ``default_rng(12345).permutation(arms)`` every round: the same."""
    rng = np.random.default_rng(12345)
    assert list(schedule.rounds(ARMS, 10, seed=12345)) == \
        [list(rng.permutation(ARMS)) for _ in range(10)]


def test_results_rows_skip_runs_done_and_survive_a_rewrite(tmp_path):
    path = tmp_path / "sub" / "r.json"
    key = lambda r: (r["ranks"], r["arm"], r["seed"])  # noqa: E731
    todo = [(2, "dense", 0), (2, "topk", 0), (3, "dense", 0)]
    rows = results.Rows(path, key, fresh={"args": {"epochs": 3}, "rows": []})
    assert rows.pending(todo) == todo and not path.exists()
    rows.add({"ranks": 2, "arm": "topk", "seed": 0, "step_s": 0.1})
    again = results.Rows(path, key, fresh={"args": {"epochs": 99}})
    assert again.data["args"] == {"epochs": 3}          # the file's, not the fresh one
    assert again.pending(todo) == [(2, "dense", 0), (3, "dense", 0)]
    again.add({"ranks": 3, "arm": "dense", "seed": 0, "step_s": 0.2})
    kept = json.loads(path.read_text())
    assert [key(r) for r in kept["rows"]] == [(2, "topk", 0), (3, "dense", 0)]
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]   # no temp file left
    assert results.load(tmp_path / "none.json", {"x": 1}) == {"x": 1}


def test_a_table_renders():
    text = tables.markdown(["arm", "step", "ratio"],
                           [["dense", tables.ms(0.01234), tables.num(None, ".2f")],
                            ["topk", tables.ms(None), tables.num(1.0, ".2f")]])
    assert text.splitlines() == ["| arm | step | ratio |", "|---|---|---|",
                                 "| dense | 12.3 ms | - |", "| topk | - | 1.00 |"]
    assert tables.series([0.912, 1.0]) == "0.91, 1.00"


def test_a_failing_launch_is_one_line_naming_the_command(capsys):
    cmd = [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(launch.LaunchError) as info:
        launch.run(cmd)
    msg = str(info.value)
    assert "\n" not in msg and "exit 3" in msg and "sys.exit(3)" in msg and sys.executable in msg
    assert "boom" in capsys.readouterr().err           # its stderr shown above the line
    with pytest.raises(launch.LaunchError, match=r"^bench: timed out after 0.3 s: .*sleep"):
        launch.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3)
    with pytest.raises(launch.LaunchError, match="no record in .*nothing.json.* after: a b"):
        launch.load_record(Path("/nonexistent/nothing.json"), ["a", "b"])
    assert launch.run([sys.executable, "-c", "print(42)"]).stdout == "42\n"


def test_a_train_line_runs_each_rank_behind_its_wrapper():
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun on PATH")
    cmd = launch.train_cmd(2, ["--epochs", "1"], "out.json", wrap=["taskset", "-c", "0"])
    i = cmd.index(sys.executable)
    assert cmd[i - 3:i] == ["taskset", "-c", "0"] and "--bind-to" in cmd[:i]
    assert cmd[i:] == [sys.executable, "-m", "hetgrad.cli", "train", "--epochs", "1",
                       "--quiet", "--out", "out.json"]


def test_records_add_to_what_record_py_summarised():
    rec = {"median_epoch_time_s": 2.0, "plan": {"steps_per_epoch": 4},
           "epochs": [{"time_s": t} for t in (9.0, 2.0, 6.0, 4.0, 5.0)],
           "sparse_steps": [{"epoch": e, "k": k, "union": 2 * k, "buildup": 2.0,
                             "bytes_sent": 8 * k, "bytes_received": 8 * k}
                            for e, k in ((1, 100), (2, 10), (3, 20))]}
    assert records.epoch_s(rec) == 2.0 and records.step_s(rec) == 0.5
    assert records.epoch_s(rec, skip=2) == 5.0 and records.step_s(rec, skip=2) == 1.25
    late = records.sparse_means(rec, after_epoch=1)
    assert late["k"] == 15 and late["union"] == 30 and late["bytes_sent"] == 120
    assert records.sparse_means(rec, after_epoch=3) == {}


def test_bench_sparse_blocks_are_random_and_the_same_on_a_rerun():
    import bench_sparse
    arms = ["dense", "topk/union", "sticky/union", "leader"]
    runs = list(bench_sparse.schedule([2, 3], [0, 1], arms))
    assert runs == list(bench_sparse.schedule([2, 3], [0, 1], arms))
    blocks = [runs[i:i + 4] for i in range(0, len(runs), 4)]
    assert [(b[0][2], b[0][0]) for b in blocks] == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert all(sorted(a for _, a, _ in b) == sorted(arms) for b in blocks)


def test_perfmodel_churn_interleaves_scenario_arm_runs(tmp_path, monkeypatch):
    """--churn SCENARIO[:ARM],...: every repeat runs each pair once (random order), with its
    arm's flags and the repeat's seed; rows keyed "SCENARIO" / "SCENARIO, ARM"; a bad pair
    stops before any run."""
    from bench.perfmodel import churn
    calls = []
    monkeypatch.setattr(churn, "churn_row", lambda rec: {
        "replanned_after_epochs": [], "steady_imbalance": 0.0, "final_batches": []})
    fake = lambda np_, args, out, wrap=None: calls.append(args) or {}  # noqa: E731
    rows = list(churn.run_churn(["emu-18-B96:equal", "emu-18-B96"], 3, 2, tmp_path, fake))
    assert len(rows) == 4 and list(rows[-1]) == ["emu-18-B96, equal", "emu-18-B96"]
    assert [len(r["runs"]) for r in rows[-1].values()] == [2, 2]
    seen = [("--mode" in a, "--rebalance" in a, a[a.index("--seed") + 1]) for a in calls]
    assert sorted(seen[:2]) == [(False, True, "0"), (True, False, "0")]
    assert sorted(seen[2:]) == [(False, True, "1"), (True, False, "1")]
    calls.clear()
    with pytest.raises(SystemExit, match="emu-18-B96:oracle"):
        next(churn.run_churn(["emu-18-B96", "emu-18-B96:oracle"], 3, 1, tmp_path, fake))
    assert calls == []


def test_perfmodel_oracle_search_then_every_arm_once_per_repeat(tmp_path, monkeypatch):
    """The grid around the first plan once per split, the best 3 twice more, then each arm
    once per repeat (seed = repeat), the oracle arm on the best split's plan file."""
    from bench.perfmodel import oracle
    calls = []

    def fake(np_, args, out, wrap=None):
        calls.append(args)
        plan = next((json.loads(Path(a).read_text()) for a in args if a.endswith(".plan.json")),
                    {"batches": [48, 48]})
        return {"plan": {"batches": [48, 48], "dataset_size": 960},   # [38, 58] is fastest
                "samples_per_s": 1000.0 - abs(plan["batches"][0] - 38)}

    monkeypatch.setattr(oracle, "summary", lambda rec: {
        "samples_per_s": rec["samples_per_s"], "efficiency": 0.5, "final_batches": [1, 1],
        "replans_after_epoch_2": 0, "final_test_accuracy": 0.9, "steady_imbalance": None,
        "predicted_step_s": None, "measured_step_s": None, "batches": [1, 1]})
    sc = oracle.run_scenario("emu-18-B96", 4, 2, tmp_path, fake)
    search = sc["oracle_search"]
    assert [t["batches"] for t in search["grid"]] == [[48, 48], [46, 50], [50, 46]]
    assert sorted(len(t["samples_per_s"]) for t in search["grid"]) == [3, 3, 3]
    assert search["best"] == [46, 50] and len(calls) == 1 + 3 + 6 + 2 * 6
    arms = calls[-12:]
    assert [a[a.index("--seed") + 1] for a in arms] == ["0"] * 6 + ["1"] * 6
    assert all(len(rs) == 2 for rs in sc["runs"].values())
    assert sum("--plan" in a for a in arms) == 2 and sc["table"]["oracle"]["over_oracle"] == 1


def test_perfmodel_ceiling_runs_every_run_once_per_repeat(tmp_path, monkeypatch):
    from bench.perfmodel import ceiling
    monkeypatch.setattr(ceiling, "step_breakdown", lambda rec, np_: {"efficiency": 1.0})
    calls = []
    fake = lambda np_, args, out, wrap=None: calls.append((np_, args)) or {}  # noqa: E731
    runs = ceiling.CEILINGS["steps_per_execution"]
    out = ceiling.run_ceiling(runs, 2, 3, tmp_path, fake)
    assert all(len(row["runs"]) == 3 for row in out.values())
    seeds = [a[a.index("--seed") + 1] for _, a in calls]
    assert seeds == [str(r) for r in range(3) for _ in runs]


def test_the_harness_and_the_table_commands_import_no_tensorflow():
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import bench.launch, bench.results, "
             "bench.schedule, bench.tables, bench.figures, bench.records, bench.placement, "
             "bench_perfmodel, bench_sparse, bench_rebalance, bench_overhead, bench_sparse_step, "
             "bench_data, experiment; "
             "print(sorted(m for m in ('tensorflow', 'horovod', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, str(SCRIPTS)], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def _run(mode: str, seed: int, final: float, epoch_s: float) -> dict:
    return {"config": {"model": "mlp", "data": "digits", "mode": mode, "seed": seed},
            "label": "1,8", "final_test_accuracy": final, "best_test_accuracy": final + 0.01,
            "median_epoch_time_s": epoch_s}


def test_the_claims_interval_is_the_paired_t_interval_over_seeds():
    diffs = np.array([0.02, 0.01, 0.005])
    got = claim.paired({0: 0.92, 1: 0.91, 2: 0.905, 3: 0.5}, {0: 0.90, 1: 0.90, 2: 0.90})
    half = 4.303 * diffs.std(ddof=1) / np.sqrt(3)          # t(0.975, 2 df)
    assert got["n"] == 3 and got["mean"] == pytest.approx(diffs.mean())
    assert (got["low"], got["high"]) == pytest.approx((diffs.mean() - half, diffs.mean() + half))
    assert claim.t975(12) == 2.228 and claim.t975(4) == 2.776   # never a narrower quantile


def test_a_cell_says_whether_the_claim_holds():
    runs = [_run(m, s, acc + 0.001 * s, t) for s in range(5)
            for m, acc, t in (("equal", 0.95, 3.0), ("uneven-avg", 0.90 - 0.002 * s, 1.0),
                              ("weighted", 0.95, 1.02))]
    (row,) = claim.cells(runs)
    assert (row["task"], row["profile"]) == ("mlp/digits", "1,8")
    assert row["diff_final"]["low"] > 0 and row["speedup_vs_equal"] == pytest.approx(3 / 1.02)
    assert row["verdict"] == "accuracy better; speed as claimed"
    slow = [dict(r, median_epoch_time_s=1.2) if r["config"]["mode"] == "weighted" else r
            for r in runs]
    assert claim.cells(slow)[0]["verdict"] == "accuracy better; speed short of the claim"
    assert "| mlp/digits | 1,8 | 5 |" in claim.markdown([row])


def test_time_to_target_is_wall_time_less_evaluation_and_old_records_still_read():
    import bench_goodput as bg
    rows = [{"time_s": 2.0, "eval_time_s": 0.1, "elapsed_s": 2.6, "test_accuracy": 0.5},
            {"time_s": 0.5, "eval_time_s": 0.1, "elapsed_s": 3.5, "test_accuracy": 0.95}]
    # the 0.4 s between the first epoch's fit and the second's counted; 0.2 s of evaluation not
    assert bg.time_to({"epochs": rows}, 0.9) == pytest.approx(3.3)
    old = [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]
    assert bg.time_to({"epochs": old}, 0.9) == pytest.approx(2.5)
    assert bg.time_to({"epochs": rows}, 0.99) is None
    # per epoch, what ran outside the fits and the evaluations: (3.5 - 2.7) / 2
    assert bg.between({"epochs": rows}) == pytest.approx(0.4)
    assert bg.between({"epochs": old, "wall_time_s": 3.9}) == pytest.approx(0.6)


def test_the_final_accuracy_is_compared_seed_by_seed():
    import bench_goodput as bg
    mine, theirs = {0: 0.95, 1: 0.93, 2: 0.96, 3: 0.5}, {0: 0.94, 1: 0.94, 2: 0.94}
    mean, se = bg.paired_difference(mine, theirs)   # seed 3 ran one arm only: left out
    assert mean == pytest.approx(0.01 / 3 * 2)   # (+1, -1, +2) / 3
    assert se == pytest.approx(0.01 * (7 / 3) ** 0.5 / 3 ** 0.5)
    assert bg.paired_difference(mine, {0: 0.9}) is None is bg.paired_difference(None, theirs)


def test_a_scenario_mixing_wall_and_fit_times_is_refused(tmp_path):
    import bench_goodput as bg
    for arm, rows in (("adaptive", [{"time_s": 1.0, "elapsed_s": 1.2, "test_accuracy": 0.9}]),
                      ("fixed-100", [{"time_s": 1.0, "test_accuracy": 0.9}])):
        rec = {"scenario": "1,2", "arm": arm, "seed": 0, "epochs": rows, "wall_time_s": 1.3,
               "probe_time_s": 0.1, "final_test_accuracy": 0.9}
        (tmp_path / f"1-2_{arm}_s0.json").write_text(json.dumps(rec))
    with pytest.raises(SystemExit, match="mixes records with and without elapsed_s"):
        bg.summarize(tmp_path, 0.85)


def test_a_first_epoch_arm_is_a_checkout_and_a_goodput_arm_with_flags(tmp_path):
    from bench_first_epoch import parse_arm
    name, directory, args = parse_arm(f"ada={tmp_path}:fixed-400 --gns --gns-every 1", 200)
    assert (name, directory) == ("ada", tmp_path.resolve())
    assert args[:2] == ["-B", "400"] and args[-3:] == ["--gns", "--gns-every", "1"]
    assert parse_arm(f"f={tmp_path}", 200)[2][:2] == ["-B", "200"]   # the default arm
    assert "--adaptive-batch" in parse_arm(f"a={tmp_path}:adaptive", 200)[2]
    with pytest.raises(SystemExit, match=r"--arm b=.*'fixd-200' is neither"):
        parse_arm(f"b={tmp_path}:fixd-200", 200)
