"""The RoI family on the CPU: tvm-roialign's ps_roi_align and roi_align_rotated against their outside
references, measured in one run.

Workload (fp32, a 256-channel P2 map of an 800 x 1088 image, 1000 rois, spatial_scale 0.25,
sampling_ratio 2):
  ps_roi_align       features 1x256x200x272 = 16 channels x 4 x 4 bins, boxes inside the image, 4x4;
                     reference: torchvision.ops.ps_roi_align (NCHW)
  roi_align_rotated  features 1x256x200x272, rotated boxes (any angle, radians), 7x7;
                     reference: OpenVINO ROIAlignRotated (opset 15, CPU, f32 inference precision)

Both layouts of ours; the references have NCHW only, so their time is the reference for both. Each
time is the median of ``--repeat`` runs after one warm-up (one run for a peer that takes over 2 s);
the results are checked against the reference (max |err| column). Prints a table of ratios and
writes JSON to ``--out``.

    python benchmarks/bench_roi_family.py [--repeat 7] [--ops ps_roi_align,roi_align_rotated]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torchvision
from _common import host_target, layout_shape, median_ms, one_op_runner, random_rois, run_meta
from rich.console import Console
from rich.table import Table

import tvm_roialign
from tvm_roialign.host import usable_cores, use_usable_cores
from tvm_roialign.testing import single_op_module

FEATURES = (1, 256, 200, 272)
IMAGE = (800, 1088)
NUM_ROIS = 1000
SCALE = 0.25
SAMPLING_RATIO = 2  # --sampling-ratio
PS_POOLED = (4, 4)
ROTATED_POOLED = (7, 7)


def rotated_rois(num, image_hw, rng):
    """``(0, cx, cy, w, h, angle)`` boxes of 16-512 pixels, centres in the image, any angle."""
    height, width = image_hw
    centre_x, centre_y = rng.uniform(0, width, num), rng.uniform(0, height, num)
    box_w, box_h = rng.uniform(16, 512, num), rng.uniform(16, 512, num)
    angle = rng.uniform(-np.pi, np.pi, num)
    return np.stack([np.zeros(num), centre_x, centre_y, box_w, box_h, angle], 1).astype("float32")


def tvm_runner(make, data_nchw, rois, layout, target):
    """``(run, result)`` of the one-op module ``make(data, rois, layout)`` built for ``target``."""
    mod = single_op_module(lambda d, r: make(d, r, layout),
                           data=(layout_shape(data_nchw.shape, layout), "float32"),
                           rois=(rois.shape, "float32"))
    return one_op_runner(mod, data_nchw, rois, layout, target)


def ps_roi_align_case(data, rng, sampling_ratio):
    rois = random_rois(NUM_ROIS, IMAGE, rng)
    data_t, rois_t = torch.from_numpy(data), torch.from_numpy(rois)

    def reference():
        return torchvision.ops.ps_roi_align(data_t, rois_t, PS_POOLED, SCALE, sampling_ratio)

    def make(d, r, layout):
        return tvm_roialign.ps_roi_align(
            d, r, PS_POOLED, spatial_scale=SCALE, sampling_ratio=sampling_ratio, layout=layout
        )

    return "torchvision", reference, lambda: reference().numpy(), make, rois


def roi_align_rotated_case(data, rng, sampling_ratio):
    import openvino as ov
    import openvino.opset15 as opset

    rois = rotated_rois(NUM_ROIS, IMAGE, rng)
    feats = opset.parameter(list(data.shape), ov.Type.f32)
    boxes = opset.parameter([NUM_ROIS, 5], ov.Type.f32)
    batch = opset.parameter([NUM_ROIS], ov.Type.i32)
    node = opset.roi_align_rotated(feats, boxes, batch, *ROTATED_POOLED, max(sampling_ratio, 0), SCALE,
                                   False)
    model = ov.Core().compile_model(ov.Model([node], [feats, boxes, batch]), "CPU",
                                    {"INFERENCE_PRECISION_HINT": "f32"})
    request = model.create_infer_request()
    inputs = [data, np.ascontiguousarray(rois[:, 1:]), rois[:, 0].astype("int32")]

    def reference():
        return request.infer(inputs)

    def make(d, r, layout):
        return tvm_roialign.roi_align_rotated(d, r, ROTATED_POOLED, spatial_scale=SCALE,
                                              sampling_ratio=sampling_ratio, layout=layout,
                                              angle_unit="radians")

    return "OpenVINO", reference, lambda: np.array(reference()[0]), make, rois


CASES = {"ps_roi_align": ps_roi_align_case, "roi_align_rotated": roi_align_rotated_case}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per measurement (median)")
    parser.add_argument("--ops", default=",".join(CASES), help="comma-separated subset of " +
                        ",".join(CASES))
    parser.add_argument("--layouts", default="NHWC,NCHW")
    parser.add_argument("--sampling-ratio", type=int, default=SAMPLING_RATIO,
                        help="samples per bin side (<= 0: adaptive)")
    parser.add_argument("--out", default="benchmarks/results", help="folder for the JSON")
    args = parser.parse_args(argv)
    sampling_ratio = args.sampling_ratio
    use_usable_cores()  # TVM's pool: every core this process may use

    console = Console(width=140)
    target = host_target()
    rng = np.random.default_rng(0)
    data = rng.standard_normal(FEATURES).astype("float32")
    rows = []
    for op in args.ops.split(","):
        peer, reference, expected_of, make, rois = CASES[op](data, rng, sampling_ratio)
        start = time.perf_counter()
        reference()  # a peer that takes seconds (OpenVINO's ROIAlignRotated) is timed once
        slow = time.perf_counter() - start > 2.0
        peer_ms = median_ms(reference, 1 if slow else args.repeat)
        expected = expected_of()
        for layout in args.layouts.split(","):
            console.print(f"[bold]{op} {layout}[/]: compiling ours ...")
            run, result = tvm_runner(make, data, rois, layout, target)
            ours_ms = median_ms(run, args.repeat)
            rows.append(dict(op=op, layout=layout, ours_ms=ours_ms, peer=peer, peer_ms=peer_ms,
                             speedup=peer_ms / ours_ms,
                             max_abs_err=float(np.abs(result() - expected).max())))

    table = Table(title=f"RoI family CPU, sampling_ratio {sampling_ratio}, {usable_cores()} cores, "
                  f"target {target}")
    for col in ("op", "layout", "ours ms", "peer", "peer ms", "x vs peer", "max |err|"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["op"], r["layout"], f"{r['ours_ms']:.2f}", r["peer"], f"{r['peer_ms']:.2f}",
                      f"{r['speedup']:.2f}", f"{r['max_abs_err']:.1e}")
    console.print(table)
    meta = run_meta(target, args.repeat, sampling_ratio)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench_roi_family_sr{sampling_ratio}.json"
    path.write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
