"""Timings beside the detector: PyTorch eager on the same pieces, and RoIAlign ours vs stock TVM."""

from __future__ import annotations

import time

import numpy as np
import torch
import tvm
from tvm import relax

from ..models.maskrcnn.pieces import piece_modules
from ..target import device_for, parse_target


def _best(fn, repeat: int):
    times, out = [], None
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def time_torch_pieces(model, image, rois, boxes, repeat: int = 1) -> dict:
    """Seconds (best of ``repeat``) of PyTorch eager for the same three pieces as TVM.

    ``rois`` ``[K, 4]`` and ``boxes`` ``[D, 4]`` are the proposals and detections the box and mask
    branches get (those of the TVM run, so that both do the same work). Returns
    ``{"backbone_s", "box_branch_s", "mask_branch_s"}``.
    """
    with torch.no_grad():
        image_list, _ = model.transform([image])
        size = tuple(image_list.tensors.shape[-2:])
        backbone, box_branch, mask_branch = piece_modules(model, "NCHW", size, rewrite=False)
        bb, outs = _best(lambda: backbone(image_list.tensors), repeat)
        feats = outs[:4]
        rois = torch.as_tensor(rois)
        boxes = torch.as_tensor(boxes)
        box, _ = _best(lambda: box_branch(*feats, rois), repeat)
        mask = _best(lambda: mask_branch(*feats, boxes), repeat)[0] if boxes.shape[0] else 0.0
    return {"backbone_s": bb, "box_branch_s": box, "mask_branch_s": mask}


# --------------------------------------------------------------------------------------------------
# RoIAlign in the heads: ours (the fused op, as in the compiled heads) vs stock TVM


def _roi_module(feature_shapes, num_rois, build_call) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    feats = [
        relax.Var(f"p{i}", relax.TensorType(list(shape), "float32")) for i, shape in enumerate(feature_shapes)
    ]
    rois = relax.Var("rois", relax.TensorType([num_rois, 5], "float32"))
    with bb.function("main", [*feats, rois]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(build_call(feats, rois)))
        bb.emit_func_output(out)
    return bb.get()


def _best_run(vm, arrays, device, repeat):
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), device) for a in arrays]

    def call():
        out = vm["main"](*args)
        device.sync()
        return out

    seconds, out = _best(call, repeat)
    return seconds, out.numpy()


def pooler_levels(pooler, features_nchw, image_size):
    """The pooler's per-level scales and its FPN ``LevelMapper``, as torchvision sets them up."""
    from torchvision.ops.poolers import _setup_scales

    return _setup_scales(
        list(features_nchw), [tuple(image_size)], pooler.canonical_scale, pooler.canonical_level
    )


def time_roi_align(features_io, rois, pooler, layout, target, image_size, repeat: int = 2) -> dict:
    """Time one head's RoIAlign: our fused ``multiscale_roi_align`` vs stock TVM's ``roi_align``.

    ``features_io`` are the 4 FPN maps in ``layout``, ``rois [K, 4]`` the head's boxes, ``pooler``
    the torchvision ``MultiScaleRoIAlign`` (output size, sampling ratio), ``target`` anything
    :func:`~tvm_roialign.target.parse_target` takes, ``image_size`` the padded image ``(H, W)``.
    The per-level scales and the level of each roi come from torchvision's own ``LevelMapper``.
    Stock TVM has no multi-level op, so it gets the rois already split by level and runs one
    ``relax.vision.roi_align`` per level, built with :func:`tvm_roialign.unregister` in effect and
    the stock ``tvm.compile`` pipeline (the level split itself is not timed). ``ours_per_level_s``
    is the same per-level split with our registration. Returns seconds (best of ``repeat``) and the
    largest difference between ours and stock.
    """
    import tvm_roialign

    from ..ops.multiscale_roi_align import make_multiscale_roi_align

    target = parse_target(target)
    device = device_for(target)
    rois = np.asarray(rois, dtype="float32")
    rois5 = np.concatenate([np.zeros((rois.shape[0], 1), "float32"), rois], axis=1)
    nchw = [
        torch.from_numpy(f).permute(0, 3, 1, 2) if layout == "NHWC" else torch.from_numpy(f)
        for f in features_io
    ]
    scales, mapper = pooler_levels(pooler, nchw, image_size)
    scales = [float(s) for s in scales]
    output_size = tuple(int(o) for o in pooler.output_size)
    sampling_ratio = int(pooler.sampling_ratio)

    mod = _roi_module(
        [f.shape for f in features_io],
        rois5.shape[0],
        lambda feats, r: make_multiscale_roi_align(
            feats, r, output_size, scales, sampling_ratio=sampling_ratio, layout=layout
        ),
    )
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), device)
    ours_s, ours = _best_run(vm, [*features_io, rois5], device, repeat)

    levels = mapper([torch.from_numpy(rois)]).numpy()

    def per_level():
        total, merged = 0.0, np.zeros_like(ours)
        for level, (feat, scale) in enumerate(zip(features_io, scales)):
            idx = np.nonzero(levels == level)[0]
            if idx.size == 0:
                continue
            mod = _roi_module(
                [feat.shape],
                idx.size,
                lambda feats, r, scale=scale: relax.op.vision.roi_align(
                    feats[0], r, output_size, scale, sampling_ratio, False, layout, "avg"
                ),
            )
            vm = relax.VirtualMachine(tvm.compile(mod, target=target), device)
            seconds, out = _best_run(vm, [feat, rois5[idx]], device, repeat)
            total += seconds
            merged[idx] = out
        return total, merged

    ours_levels_s, _ = per_level()
    with tvm_roialign.stock_tvm():
        stock_s, stock = per_level()
    return {
        "num_rois": int(rois.shape[0]),
        "ours_s": ours_s,
        "ours_per_level_s": ours_levels_s,
        "stock_s": stock_s,
        "speedup": stock_s / ours_s if ours_s > 0 else float("inf"),
        "speedup_per_level": stock_s / ours_levels_s if ours_levels_s > 0 else float("inf"),
        "max_abs_diff_ours_vs_stock": float(np.abs(ours - stock).max()) if ours.size else 0.0,
    }


__all__ = ["pooler_levels", "time_roi_align", "time_torch_pieces"]
