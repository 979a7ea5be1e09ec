"""The one table of degenerate RoIAlign boxes of the suite (tests/test_roi_family.py runs it through every
path against the reference; tests/test_cpu_kernel.py through the CPU kernel against the TE compute)."""

import numpy as np

NAN, INF = float("nan"), float("inf")

#: (batch, x1, y1, x2, y2) in feature-map pixels (spatial_scale 1), for a batch of 2 maps of about
#: 11 x 13: zero size, inverted, outside, non-finite, huge, out-of-range batch, and ordinary boxes.
DEGENERATE_ROIS = np.array(
    [
        [0, 3, 3, 3, 3],  # zero size
        [1, 6, 6, 2, 2],  # inverted
        [0, -30, -30, -20, -20],  # outside the map
        [0, 100, 100, 120, 130],  # outside the map
        [2, 1, 1, 5, 5],  # batch index == N
        [-3, 1, 1, 5, 5],  # negative batch index
        [NAN, 1, 1, 5, 5],  # NaN batch index
        [0, NAN, 1, 5, 5],  # NaN coordinate
        [0, 1, 1, NAN, 5],  # NaN end (a >= 1 clamp must not hide it)
        [0, NAN, NAN, NAN, NAN],  # every coordinate NaN
        [0, -INF, -INF, INF, INF],  # infinite box
        [1, 1e30, 1e30, 1e30, 1e30],  # huge coordinates, zero size
        [1, -0.9, 2, 1e-3, 2.5],  # thin box at the border
        [1, 1, 1, 6, 6],  # an ordinary box
        [0, 9, 8, 40, 25],  # past the right and bottom border
    ],
    dtype="float32",
)
#: rows that are 0 whatever the mode: no valid sample
ZERO_ROWS = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
#: rows with valid samples (non-zero on random data)
SAMPLED_ROWS = [12, 13, 14]
