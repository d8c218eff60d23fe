"""Weighted aggregation on 3 real ranks equals one process on the concatenated batch."""


def test_three_ranks_weighted_step_equals_full_batch(world3):
    d = world3.run("weighted_step:run").root
    weightings = ["plan", "planobj", "samples", "default"]
    if d["flavour"] != "keras3":
        weightings.append("legacy")  # Keras 2's OptimizerV2 family
    for model in ("dense", "embedding"):
        # the step actually moved the weights, so a zero difference is meaningful
        assert d[f"{model}_step_size"] > 1e-2
        for weighting in weightings:
            assert d[f"{model}_{weighting}"] < 1e-5, (model, weighting, d)
        # Horovod's plain average of unequal batches is provably a different step
        assert d[f"{model}_horovod_avg"] > 1e-3, d
        # and so is no aggregation at all (what a silently skipped allreduce gives)
        assert d[f"{model}_local"] > 1e-3, d
    # a partial final batch: exact with counted samples or per-step plan weights, not b_i/B
    assert d["partial_samples"] < 1e-5, d
    assert d["partial_planobj"] < 1e-5, d  # the plan knows the final step is partial
    assert d["partial_plan"] > 1e-3, d
    # set_plan between steps (rebalancing) takes effect in the traced step, exactly
    assert d["switched_step_size"] > 1e-2, d
    assert d["switched_plan"] < 1e-5, d
    # sparse top-k with the union exchange, same uneven batches: exact on U, nothing elsewhere
    k = 20  # ceil(0.1 x 192) per rank; U is between k and 3k
    assert k <= d["sparse_union_size"] <= 3 * k, d
    assert d["sparse_on_union"] < 1e-6 and d["sparse_off_union_kernel"] == 0.0, d
    assert d["sparse_dropped_step"] > 1e-4, d  # the full step did move entries off U
    assert d["sparse_small_tensors"] < 1e-6, d
