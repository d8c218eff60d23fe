"""Regenerate hetgrad/datasets/digits.npz from scikit-learn's bundled digits.csv.gz.

The UCI optical digits (1,797 8x8 images, values 0..16) as shipped by scikit-learn (BSD).
Split: a fixed seeded 80/20 train/test permutation, stored in Keras .npz layout.
Usage: python scripts/make_digits_npz.py path/to/digits.csv.gz
"""
import sys

import numpy as np

raw = np.loadtxt(sys.argv[1], delimiter=",")
x = raw[:, :-1].reshape(-1, 8, 8).astype(np.uint8)
y = raw[:, -1].astype(np.uint8)
perm = np.random.default_rng(0).permutation(len(y))
cut = int(0.8 * len(y))
tr, te = perm[:cut], perm[cut:]
np.savez_compressed("hetgrad/datasets/digits.npz", x_train=x[tr], y_train=y[tr],
                    x_test=x[te], y_test=y[te])
print("train", len(tr), "test", len(te))
