"""The run record is a pure function of what the trainer measured (no MPI, no TF)."""
import pytest

from hetgrad.partition import make_plan
from hetgrad.record import build_record, sparse_bytes


def rows(times, accs):
    return [{"epoch": i + 1, "loss": 1.0 / (i + 1), "time_s": t, "test_accuracy": a}
            for i, (t, a) in enumerate(zip(times, accs))]


def record(**kw):
    plan = make_plan([1, 3], 96, 1000)
    args = dict(config={"mode": "weighted"}, world_size=2, device="/CPU:0", controller="mpi",
                ranks=[{"node": None}, {"node": None}], probe=[{"samples_per_s": 100.0}, {"samples_per_s": 300.0}], probe_time_s=1.5,
                first_plan=plan, final_plan=plan, epochs=rows([4.0, 2.0, 2.5], [0.5, 0.8, 0.7]),
                wall_time_s=9.0, per_rank_epoch_times_s=[[4.0, 2.0, 2.5], [3.9, 1.9, 2.6]],
                balance=[])
    args.update(kw)
    return build_record(**args)


def test_throughput_from_the_median_epoch_and_the_probed_rates():
    rec = record()
    assert rec["median_epoch_time_s"] == 2.25  # of 2.0 and 2.5: the first (tracing) epoch out
    assert rec["samples_per_s"] == pytest.approx(1000 / 2.25)
    assert rec["ideal_samples_per_s"] == 400.0
    assert rec["throughput_efficiency"] == pytest.approx(1000 / 2.25 / 400)
    assert rec["final_test_accuracy"] == 0.7 and rec["best_test_accuracy"] == 0.8
    # each rank keeps its own epoch times (not a cross-rank average)
    assert rec["per_rank_epoch_times_s"][1] == [3.9, 1.9, 2.6]
    assert "sparse_summary" not in rec


def test_dropped_samples_do_not_count_and_the_final_plan_is_kept():
    first = make_plan([1, 1, 1], 96, 1442, drop_remainder=True)  # a final step of 2: dropped
    assert first.dropped == 2
    later = make_plan([1, 2, 1], 96, 1442, drop_remainder=True)
    rec = record(first_plan=first, final_plan=later, per_rank_epoch_times_s=[[1.0]] * 3,
                 epochs=rows([2.0], [0.9]))
    assert rec["samples_per_s"] == pytest.approx(1440 / 2.0)
    assert rec["plan"]["batches"] == [32, 32, 32] and rec["final_plan"]["batches"] == [24, 48, 24]


def test_sparse_summary_is_the_mean_over_steps():
    steps = [{"epoch": 1, "step": i, "k": 10, "union": u, "buildup": u / 10,
              "bytes_sent": 80 * u, "bytes_received": 40 * u}
             for i, u in enumerate([10, 20, 30])]
    rec = record(sparse_steps=steps, sparse_bytes_per_rank=[sparse_bytes(steps)] * 2)
    assert rec["sparse_summary"]["union"] == 20 and rec["sparse_summary"]["buildup"] == 2.0
    assert rec["sparse_bytes_per_rank"][0] == {"bytes_sent": 4800, "bytes_received": 2400}


HETSTEP = {"SLURM_NTASKS_HET_GROUP_0": "1", "SLURM_NTASKS_HET_GROUP_1": "2",
           "SLURM_STEP_NUM_TASKS": "3"}


@pytest.mark.parametrize("env,expected", [
    ({**HETSTEP, "SLURM_PROCID": "0"}, 0),
    ({**HETSTEP, "SLURM_PROCID": "1"}, 1),
    ({**HETSTEP, "SLURM_PROCID": "2"}, 1),
    ({**HETSTEP, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, None),  # one component's step
    ({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "3"}, None),            # not a hetjob
    ({**HETSTEP, "SLURM_PROCID": "2", "HETGRAD_COMPONENT": "0"}, 0),       # said explicitly
])
def test_hetjob_component_of_a_task(env, expected):
    from hetgrad.placement import component, here
    assert component(env) == expected
    assert here("/CPU:0", {**env, "SLURMD_NODENAME": "cpu1"})["node"] == "cpu1"
