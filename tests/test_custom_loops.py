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
