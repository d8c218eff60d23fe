"""Cases that check the test world itself (tests/test_world.py)."""
import os

import horovod.tensorflow as hvd
import tensorflow as tf


def ranks_and_sum(env_key: str) -> dict:
    """This rank, an allreduce over the world, what was printed, and an environment value."""
    total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum).numpy()[0]
    print(f"rank {hvd.rank()} here")
    return {"rank": hvd.rank(), "size": hvd.size(), "sum": float(total),
            "env": os.environ.get(env_key)}


def fail_on(rank: int) -> None:
    """``rank`` raises while the others wait for it in an allreduce."""
    if hvd.rank() == rank:
        raise ValueError(f"injected failure on rank {rank}")
    hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="waits_forever")
