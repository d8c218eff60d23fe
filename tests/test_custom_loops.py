"""Every Horovod path with the one-line switch and no hetgrad callback (tests/mpi/custom_loops.py,
3 real ranks, batches 5, 11, 16): Keras' own train steps count their batches, so they weigh
exactly; a GradientTape loop through hetgrad.tensorflow weighs exactly when told the batch
(samples= or weight=); where nothing can know it, the ranks weigh equally -- Horovod's
average -- and rank 0 says so once."""
import numpy as np

UNCOUNTED = "hetgrad: warning: the batch size of this step is not known here"


def test_paths_without_callbacks_weigh_uneven_batches(world3):
    res = world3.run("custom_loops:run")
    r = res.root
    assert r["moved"] > 1e-2 and r["average_vs_exact"] > 1e-3, r   # the cases differ
    for path in ("fit", "train_on_batch", "tape_samples", "tape_share", "tape_function"):
        assert r[f"{path}_vs_exact"] < 1e-5, (path, r)
    for path in ("tape_default", "apply_gradients"):       # nothing knows the batch sizes
        assert r[f"{path}_vs_average"] < 1e-5, (path, r)
    for path, weights in r["weights"].items():              # the ranks agree
        for other in res.values[1:]:
            np.testing.assert_allclose(other["weights"][path], weights, rtol=0, atol=1e-6)
    assert res.stderr[0].count(UNCOUNTED) == 2, res.stderr[0]   # the tapes', the optimizer's
    assert all(UNCOUNTED not in e for e in res.stderr[1:])


def test_local_variables_partial_optimizer_and_op_sum(world3):
    r = world3.run("custom_loops:local_variables").root
    assert r["local_layer_vs_own"] < 1e-6, r       # w_i g_i, never exchanged
    assert r["shared_layer_vs_exact"] < 1e-5, r    # the rest: the full-batch step
    assert r["local_kept"] == 0.0 and r["shared_from_root"] == 0.0, r
    assert r["sum_vs_size_times_average"] < 1e-5, r


def test_elastic_state_syncs_commits_and_restores(world2):
    res = world2.run("custom_loops:elastic_state")
    for r in res.values:
        assert r["synced_vs_root"] == 0.0 and r["synced_attrs"] == [20, 10], r
        assert r["restored"] == [0.0, 20, 10], r
        assert r["committed"][0] < 1e-6 and r["committed"][1:] == [21, 11], r


def test_horovods_compute_gradients_with_passes_and_a_local_variable(world2):
    for r in world2.run("custom_loops:horovod_compute_gradients").values:
        if r:   # Keras 2 flavours (Keras 3 optimizers have no _compute_gradients)
            np.testing.assert_allclose(r["values"], r["want"], rtol=0, atol=1e-6)
            assert r["iterations"] == 4
