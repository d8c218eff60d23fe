"""The library path on real ranks: hk.probe on the user's own models, hetgrad.make_plan,
hk.shard + DistributedOptimizer(plan=plan) over a whole epoch vs one process.
(the case ``library:run`` of a test world, tests/world.py).
"""

import time

import numpy as np
import tensorflow as tf

import hetgrad
import hetgrad.keras as hk
from hetgrad._keras.found import aggregation_in
from hetgrad.compat import keras, optimizer_variables
from regression_problem import B, LR, N, regression_data  # tests/mpi/


def run() -> dict:
    comm = hetgrad.init()
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng(0)
    x, y = regression_data(rng)
    res = {}

    def regression(seed=1):
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                                 keras.layers.Dense(1)])

    def state(model):
        agg = aggregation_in(model.optimizer)   # hetgrad's own: its step count, plan shares..
        own = agg.own_variables() if agg is not None else []
        return [v.numpy().copy()
                for v in model.variables + optimizer_variables(model.optimizer) + own]

    def probe_leaves_state(model, xs, ys):
        """hk.probe's points and that weights and optimizer state are exactly as before."""
        model.fit(xs, ys, batch_size=16, epochs=1, verbose=0)  # optimizer state that is not zero
        before = state(model)
        perf = hk.probe(model, xs, ys, global_batch=B, steps=3, warmup=1, refine=1)
        after = state(model)
        same = len(before) == len(after) and all(np.array_equal(a, b)
                                                 for a, b in zip(before, after))
        return {"same_state": same, "ranks": [p.rank for p in perf],
                "batches": [[b for b, _ in p.points] for p in perf],
                "refined_at": [[b for b, _ in p.plan_points] for p in perf],
                "through_point": all(abs(p.model().time(b) / t - 1) < 1e-9
                                     for p in perf for b, t in p.plan_points),
                "positive": all(t > 0 for p in perf for _, t in p.points)}, perf

    # 1. probe a regression model (Adam: slots) and a two-input model (dict inputs)
    reg = regression()
    reg.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    res["regression"], perf = probe_leaves_state(reg, x, y)
    a_in, b_in = keras.Input((5,), name="a"), keras.Input((3,), name="b")
    two = keras.Model([a_in, b_in], keras.layers.Dense(1)(keras.layers.Concatenate()([a_in, b_in])))
    two.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    xd = {"a": x, "b": rng.normal(size=(N, 3)).astype(np.float32)}
    res["two_input"], _ = probe_leaves_state(two, xd, y)
    from_ds = hk.probe(reg, tf.data.Dataset.from_tensor_slices((x, y)), global_batch=B,
                       steps=2, warmup=1, verbose=True)   # what hk.shard takes, hk.probe takes
    res["tf_data_probe"] = [[p.rank, len(p.points)] for p in from_ds]

    # 2. the plan from the probe; a fixed plan for the exactness check (speeds 1, 2, 4)
    res["probe_plan"] = hetgrad.make_plan(perf, B, N).batches
    plan = hetgrad.make_plan([1, 2, 4][:size], B, N)  # 5 steps, the last one partial
    res["plan"] = {"batches": plan.batches, "last": plan.last_batches()}

    # a model compiled with hetgrad's optimizer: probed on its own step alone, all put back
    dist = regression()
    dist.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(0.01), plan=plan),
                 loss="mse")
    res["hetgrad_optimizer"], _ = probe_leaves_state(dist, x, y)
    # rank 0 capped at 2 samples has one size to time, the others three: rank 0 times its one
    # three times, so that every rank's gathers pair up (they did not before)
    capped = hk.probe(dist, x, y, global_batch=B, max_batch=2 if rank == 0 else None,
                      steps=2, warmup=1, verbose=True)
    res["capped_sizes"] = [len(p.points) for p in capped]

    # 3. one epoch of hk.shard + DistributedOptimizer(plan=plan) ...
    model = regression(seed=3)
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(LR), plan=plan),
                  loss="mse")
    traces = [aggregation_in(model.optimizer).traces]   # of the step around its exchange
    model.fit(hk.shard(x, y, plan, seed=7), epochs=1, steps_per_epoch=plan.steps_per_epoch,
              verbose=0)
    got = model.get_weights()
    traces.append(aggregation_in(model.optimizer).traces)
    model.fit(hk.shard(x, y, plan, seed=8), epochs=1, steps_per_epoch=plan.steps_per_epoch,
              verbose=0)   # the same step again: no trace
    res["traces"] = [*traces, aggregation_in(model.optimizer).traces]

    # ... against one process on the same global batches (every rank's batch of each step)
    ref, avg = regression(seed=3), regression(seed=3)
    iters = [iter(hk.shard(x, y, plan, seed=7, rank=r)) for r in range(size)]
    for step in range(plan.steps_per_epoch):
        parts = [next(it) for it in iters]
        xs = tf.concat([p[0] for p in parts], 0)
        ys = tf.concat([p[1] for p in parts], 0)
        for m, batches in ((ref, [(xs, ys)]), (avg, parts)):  # avg: Horovod's equal average
            grads = []
            for bx, by in batches:
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(m(bx) - by))
                grads.append(tape.gradient(loss, m.trainable_variables))
            for v, *g in zip(m.trainable_variables, *grads):
                v.assign_sub(LR * tf.add_n(g) / len(g))
    res["exact_err"] = max(float(np.max(np.abs(a - b))) for a, b in zip(got, ref.get_weights()))
    res["avg_diff"] = max(float(np.max(np.abs(a - b)))
                          for a, b in zip(ref.get_weights(), avg.get_weights()))
    res["weights_agree"] = all(np.array_equal(a, b) for a, b in
                               zip(got, comm.bcast(got if rank == 0 else None, root=0)))

    return res


def idle_wait(delay: float = 1.0, size: int = 100_000) -> dict:
    """The CPU time of each rank's thread in a timed gather (the probe's) of ``size`` bytes a
    rank (beyond MPI's eager sends) that rank 0 joins ``delay`` seconds late: the ranks that
    wait must not spin on a core (MPI's blocking calls do), or where ranks share cores they
    slow those still timing their steps."""
    comm = hetgrad.init()
    comm.barrier()
    if comm.rank == 0:
        time.sleep(delay)
    wall, cpu = time.perf_counter(), time.thread_time()
    got = comm.gather_with_timeout((comm.rank, bytes(size)), timeout=60.0)
    return {"got": [(r, len(b)) for r, b in got], "wall_s": time.perf_counter() - wall,
            "cpu_s": time.thread_time() - cpu}
