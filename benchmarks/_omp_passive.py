"""Imported first by a benchmark that interleaves runtimes: their OpenMP threads (PyTorch's, ONNX
Runtime's) sleep between calls (``OMP_WAIT_POLICY=PASSIVE``, unless the environment sets it; an
OpenMP runtime reads it once, when it loads) instead of spinning on the cores the next runner's
turn needs."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
