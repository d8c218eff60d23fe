"""TF thread settings: hetgrad keeps an inter-op thread for the exchange besides compute, and
the optimizer warns a user's script that has only one (docs/results.md#overhead)."""
import subprocess
import sys
import warnings

import pytest
import tensorflow as tf

from hetgrad._keras import optimizer as hk_optimizer


def test_configure_tf_keeps_two_inter_op_threads():
    code = ("import tensorflow as tf\nfrom hetgrad.runtime import configure_tf\n"
            "t = tf.config.threading\n"
            "for n in (1, 3):\n"
            "    configure_tf(n, 'cpu')\n"
            "    print(t.get_intra_op_parallelism_threads(), "
            "t.get_inter_op_parallelism_threads())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split("\n")
    assert out[:2] == ["1 2", "3 3"]


@pytest.mark.parametrize("inter_op,rank,warned", [(1, 0, True), (1, 1, False),
                                                  (2, 0, False), (0, 0, False)])
def test_optimizer_warns_about_one_inter_op_thread(monkeypatch, inter_op, rank, warned):
    monkeypatch.setattr(tf.config.threading, "get_inter_op_parallelism_threads",
                        lambda: inter_op)
    monkeypatch.setattr(hk_optimizer.hvd, "rank", lambda: rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hk_optimizer._check_inter_op_threads()
    messages = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert messages == ([hk_optimizer.ONE_INTER_OP_THREAD] if warned else [])
