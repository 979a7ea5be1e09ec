"""The photo-in, detections-out function of a detector artifact: ``detect_photo`` (part of
:mod:`tvm_roialign.models.detection`).

``detect_photo(photo [H, W, 3] uint8)`` does in the graph what the Python runner
(:class:`tvm_roialign.runtime.Detector`) does around the artifact's function for any size
(``detect``): torchvision's transform (the resized size computed from the photo's shape in a small
kernel and made a shape with ``R.tensor_to_shape``; normalization, bilinear resize, zero padding),
a call of ``detect`` itself (the network is compiled once and shared), and the postprocess: the
first ``num_detections`` rows, boxes scaled to the photo, for Mask R-CNN each mask pasted into the
photo and thresholded at 0.5, for Keypoint R-CNN the keypoints read from their heatmaps. It returns
``boxes [D, 4]`` float32 (the photo's pixels), ``labels [D]`` int64, ``scores [D]`` float32, and
``masks [D, H, W]`` uint8 (Mask R-CNN) or ``keypoints [D, K, 3]`` and ``keypoints_scores [D, K]``
(Keypoint R-CNN), ``D`` the number of detections. A photo whose padded size the function does not
serve stops the call with an error (a shape check of the VM). The kernels: :mod:`tvm_roialign.topi.photo` and
:mod:`tvm_roialign.topi.photo_keypoints`.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.s_tir import Schedule

from ..runtime.detector import PHOTO_FUNCTION
from ..runtime.transform import TransformSettings, feature_heights, min_height_for_scales, pooler_scales
from ..strategies.base import mark_scheduled
from ..topi import photo as kernels
from ..topi.photo_keypoints import heatmaps_to_keypoints

__all__ = ["PHOTO_FUNCTION", "add_photo_function", "lowest_heights", "serves_photos", "transform_photo"]

#: The outputs of :data:`PHOTO_FUNCTION` per output of the network that it reads.
_OUTPUTS = ("boxes", "labels", "scores")


#: The kernels with one output per pixel, whose rows run in parallel (:func:`_rows_in_parallel`).
_PER_PIXEL = ("preprocess_photo", "mask_columns", "paste_masks")


def _rows_in_parallel(func, block: str):
    """``func`` (one block, ``block``) with its loops but the last fused and parallel, the last
    (the photo's columns) left whole, marked as scheduled: a fused loop over the symbolic sizes,
    as the generic rules make it, divides its index back into coordinates at every element."""
    sch = Schedule(func)
    loops = sch.get_loops(sch.get_sblock(block))
    sch.parallel(sch.fuse(*loops[:-1]))
    return mark_scheduled(sch.mod["main"])


def serves_photos(meta: dict, target) -> bool:
    """Whether an artifact of ``meta`` built for ``target`` gets :data:`PHOTO_FUNCTION`: one
    function for any size (``any_size``), boxes with or without masks (not keypoints, whose
    heatmaps the runner reads), an LLVM target (the kernels' fused multiply-adds)."""
    return bool(meta.get("any_size")) and target.kind.name == "llvm"


def lowest_heights(entry: dict, settings: TransformSettings) -> np.ndarray:
    """Per padded height ``k * size_divisible`` up to the function's largest side, the smallest
    resized height it serves (-1 where torchvision's poolers infer other scales than the function's
    or the height is out of its bounds): the runner's check of a photo as a table."""
    divisor = settings.size_divisible
    table = np.full(entry["max_side"] // divisor + 1, -1, np.int64)
    for k in range(len(table)):
        padded = k * divisor
        if padded < entry["min_side"]:
            continue
        heights = [feature_heights(padded, row) for row in entry["pooler_strides"]]
        if [pooler_scales(h, padded) for h in heights] == entry["pooler_scales"]:
            table[k] = min_height_for_scales(heights, padded, divisor)
    return table


def _symbolic(bb, tensor, names):
    """Variables for the values of a 1-D int64 ``tensor`` as a shape."""
    variables = [tirx.Var(name, "int64") for name in names]
    shape = bb.emit(relax.op.tensor_to_shape(tensor))
    bb.match_cast(shape, relax.ShapeType(variables))
    return variables


def transform_photo(bb, photo, meta, settings):
    """``(images, image_size, sizes)``: the photo (a Relax variable of ``bb``) through torchvision's
    transform, ``meta`` the artifact's metadata (its ``any_size`` entry bounds the sizes)."""
    entry = meta["any_size"]
    sizes = bb.emit_te(kernels.resized_size, photo, settings.min_size, settings.max_size)
    table = relax.const(lowest_heights(entry, settings), "int64")
    served = bb.emit_te(
        kernels.size_is_served, sizes, table, settings.size_divisible,
        (entry["min_side"], entry["max_side"]),
    )
    # a photo the function does not serve stops the call: its flag, as a shape, must match (1,)
    # (a check of the VM itself, which TVM's runtime alone runs; R.assert_op needs the compiler's)
    flag = bb.emit(relax.op.tensor_to_shape(served))
    bb.match_cast(flag, relax.ShapeType([1]))
    rows, columns = _symbolic(bb, sizes, ("resized_h", "resized_w"))

    def preprocess_photo(tensor, height, width):
        return kernels.preprocess_photo(tensor, height, width, settings, settings.resize_fma)

    images = bb.emit_te(preprocess_photo, photo, rows, columns)
    image_size = bb.emit(relax.op.astype(sizes, "float32"))
    return images, image_size, sizes


def _keypoints(bb, raw, count, detections, sizes, photo):
    """``[keypoints [n, K, 3], keypoints_scores [n, K]]`` in the photo's pixels."""
    heatmaps = raw["keypoint_heatmaps"]
    most, num_keypoints, _, size = (int(v) for v in heatmaps.ty.shape.values[1:5])
    kernel = bb.add_func(heatmaps_to_keypoints(most, num_keypoints, size), "heatmaps_to_keypoints")
    out = bb.emit(relax.call_tir(
        kernel,
        [heatmaps, raw["boxes"], count, sizes, bb.emit_te(kernels.photo_size, photo)],
        [relax.TensorType([most, num_keypoints, 3], "float32"),
         relax.TensorType([most, num_keypoints], "float32")],
    ))
    return [
        bb.emit_te(kernels.leading_rows, bb.emit(relax.TupleGetItem(out, i)), detections)
        for i in range(2)
    ]


def _postprocess(bb, outputs, names, sizes, photo):
    """The first ``num_detections`` rows in the photo's coordinates, masks pasted, keypoints
    read from their heatmaps."""
    photo_shape = tuple(photo.ty.shape.values[:2])
    count = bb.emit(relax.TupleGetItem(outputs, names.index("num_detections")))
    (detections,) = _symbolic(bb, count, ("num_detections",))
    raw = {name: bb.emit(relax.TupleGetItem(outputs, i)) for i, name in enumerate(names)}
    boxes = bb.emit_te(kernels.photo_boxes, raw["boxes"], detections, sizes, photo_shape)
    results = [boxes]
    for name in ("labels", "scores"):
        results.append(bb.emit_te(kernels.first_rows, raw[name], detections))
    if "masks" in raw:
        mask_size = int(raw["masks"].ty.shape[-1])
        expanded = bb.emit_te(kernels.expanded_mask_boxes, boxes, mask_size)
        columns = bb.emit_te(kernels.mask_columns, raw["masks"], expanded, photo_shape[1])
        rows = bb.emit_te(kernels.mask_rows, expanded, photo_shape[0], mask_size)
        weights = [bb.emit(relax.TupleGetItem(rows, j)) for j in range(2)]
        results.append(bb.emit_te(kernels.paste_masks, columns, *weights, expanded))
    if "keypoint_heatmaps" in raw:
        results.extend(_keypoints(bb, raw, count, detections, sizes, photo))
    return results


def add_photo_function(mod: tvm.IRModule, meta: dict) -> tuple[tvm.IRModule, dict]:
    """``mod`` with :data:`PHOTO_FUNCTION` beside its function for any size, and ``meta`` with
    ``photo_function``: its name and outputs (see the module doc)."""
    settings = TransformSettings.from_dict(meta["transform"])
    names = list(meta["outputs"])
    height, width = tirx.Var("photo_h", "int64"), tirx.Var("photo_w", "int64")
    photo = relax.Var("photo", relax.TensorType([height, width, 3], "uint8"))
    bb = relax.BlockBuilder()
    # functions added through the builder get global variables typed for calls
    functions = {gv.name_hint: bb.add_func(func, gv.name_hint) for gv, func in mod.functions_items()}
    network = functions[meta["any_size"]["function"]]
    with bb.function(PHOTO_FUNCTION, [photo]):
        images, image_size, sizes = transform_photo(bb, photo, meta, settings)
        outputs = bb.emit(relax.Call(network, [images, image_size]))
        results = _postprocess(bb, outputs, names, sizes, photo)
        bb.emit_func_output(relax.Tuple(results))
    mod = bb.get() if mod.attrs is None else bb.get().with_attrs(mod.attrs)
    for gv, func in mod.functions_items():
        if gv.name_hint in _PER_PIXEL:
            mod[gv] = _rows_in_parallel(func, gv.name_hint)
    mod[PHOTO_FUNCTION] = mod[PHOTO_FUNCTION].with_attr("global_symbol", PHOTO_FUNCTION)
    outputs = [*_OUTPUTS, *(["masks"] if "masks" in names else [])]
    if "keypoint_heatmaps" in names:
        outputs += ["keypoints", "keypoints_scores"]
    entry = {"function": PHOTO_FUNCTION, "outputs": outputs}
    if "masks" in names:
        entry["mask_threshold"] = 0.5
    return mod, {**meta, "photo_function": entry}
