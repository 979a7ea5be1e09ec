"""What the transform and postprocess inside ``detect_photo`` cost, as a share of the artifact's time.

For a Mask R-CNN artifact compiled for any size (``tvm-roialign compile maskrcnn_resnet50_fpn -o
maskrcnn.so``) and a 512x512 photo (the astronaut): the network (``detect``, on the runner's
transformed image) and each in-graph step of ``detect_photo`` (its kernels, called one by one from the
library on the same photo's shapes and the network's own outputs) take turns, round after round; the
medians of ``--repeat`` rounds give the steps' share of ``detect_photo`` (the steps plus the network).
The result of ``detect_photo`` is compared with the Python runner's first.

    python benchmarks/bench_photo_steps.py maskrcnn.so [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import tvm

from tvm_roialign.runtime import Detector
from tvm_roialign.runtime.sample_photos import sample_photo


def _kernel(library, name: str):
    """A kernel of the library by its name (the build may have suffixed it with 1)."""
    for candidate in (name, f"{name}1"):
        try:
            return library.get_function(candidate)
        except AttributeError:
            continue
    raise SystemExit(f"no kernel {name!r} in the library (compiled before detect_photo?)")


def _steps(library, raw, rgb, count):
    """``[(name, kernel, arguments)]`` of the in-graph steps on ``rgb`` and the network's ``raw``."""
    height, width = rgb.shape[:2]
    tensor, i64, f32 = tvm.runtime.tensor, np.int64, np.float32

    def zeros(shape, dtype):
        return tensor(np.zeros(shape, dtype))

    sizes = tensor(np.array(raw["resized"][0], i64))
    boxes, expanded = zeros((count, 4), f32), zeros((count, 4), i64)
    columns = zeros((count, 30, width), f32)
    rows, weights = zeros((count, height, 2), i64), zeros((count, height, 2), f32)
    photo = tensor(rgb)
    arguments = {
        "resized_size": [photo, zeros((2,), i64)],
        "preprocess_photo": [photo, *raw["resized"][0][::-1], zeros((1, 3, *raw["padded"]), f32)],
        "photo_boxes": [tensor(raw["boxes"]), sizes, width, height, boxes],
        "expanded_mask_boxes": [boxes, expanded],
        "mask_columns": [tensor(raw["masks"]), expanded, columns],
        "mask_rows": [expanded, rows, weights],
        "paste_masks": [columns, rows, weights, expanded, zeros((count, height, width), np.uint8)],
    }
    return [(name, _kernel(library, name), args) for name, args in arguments.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", help="a Mask R-CNN artifact compiled for any size")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    detector = Detector(args.library)
    rgb = sample_photo("astronaut")
    ours = [o.numpy() for o in detector.vm["detect_photo"](tvm.runtime.tensor(rgb))]
    ref = detector(rgb)
    print(f"detect_photo against the runner: {len(ours[1])} / {len(ref['labels'])} detections, "
          f"boxes within {np.abs(ours[0] - ref['boxes']).max():.1e} px, "
          f"masks {(ours[3] == (ref['masks'] > 0.5)).mean() * 100:.3f}% equal")
    raw = detector.raw(rgb)
    image = detector.settings(rgb)
    batch = np.zeros((1, 3, *raw["padded"]), np.float32)
    batch[0, :, : image.shape[1], : image.shape[2]] = image
    inputs = [tvm.runtime.tensor(batch), tvm.runtime.tensor(np.asarray(image.shape[1:], np.float32))]
    library = tvm.runtime.load_module(args.library).imports[0]
    steps = _steps(library, raw, rgb, int(raw["num_detections"][0]))
    network = detector.vm["detect"]
    times = {name: [] for name, _, _ in steps} | {"network": []}
    for _ in range(args.repeat + 1):  # the first round warms up
        start = time.perf_counter()
        network(*inputs)
        times["network"].append(time.perf_counter() - start)
        for name, kernel, arguments in steps:
            start = time.perf_counter()
            kernel(*arguments)
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values[1:]) * 1e3 for name, values in times.items()}
    steps_ms = sum(v for k, v in median.items() if k != "network")
    print(", ".join(f"{k} {v:.2f} ms" for k, v in median.items()))
    print(f"in-graph steps {steps_ms:.1f} ms of {steps_ms + median['network']:.0f} ms: "
          f"{steps_ms / (steps_ms + median['network']) * 100:.1f}% of detect_photo at "
          f"{rgb.shape[0]}x{rgb.shape[1]}")


if __name__ == "__main__":
    main()
