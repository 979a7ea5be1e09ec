"""A torchvision detector (or its exported program) as a Relax module of one function per padded
size, or one for any size, with the metadata its artifact carries (part of
:mod:`tvm_roialign.models.detection`)."""

from __future__ import annotations

import tvm

from ..passes.desired_layouts import desired_layouts
from ..passes.fold_constant_if_foldable import FoldConstantIfFoldable
from ..passes.fold_constant_numpy import FoldConstantNumPy
from ._torchvision import detector_names
from .detector_sizes import ANY, ANY_FUNCTION, bucket_sizes, function_name


def _import_one(model, padded, *, offset_trick_max_numel, float64):
    from ..frontend.detection import export_detector, from_exported_program

    program, static = export_detector(
        model, padded, offset_trick_max_numel=offset_trick_max_numel, float64=float64
    )
    # imported as exported, without PyTorch's decompositions: a second trace of the whole
    # detector (9 s of Mask R-CNN's import on a Zen 4) for ops the importer converts whole anyway
    mod = from_exported_program(program, keep_params_as_input=False, run_ep_decomposition=False)
    if padded == ANY:
        return mod["main"], _any_entry(static), static
    bucket = {
        "padded": list(static.padded),
        "function": function_name(static.padded),
        "min_resized_height": static.min_height(),
        "pooler_strides": static.pooler_strides(),  # the runner's check of a photo too thin
    }
    return mod["main"], bucket, static


def _any_entry(static) -> dict:
    """The metadata of the function for any padded size: its name, the padded sides it takes,
    and what the runner needs to check a batch's scales (the poolers' strides and scales)."""
    from ..frontend.detection import ANY_SIDES
    from ..runtime.transform import feature_heights, pooler_scales

    strides = static.pooler_strides()
    height = static.padded[0]
    return {
        "function": ANY_FUNCTION,
        "min_side": ANY_SIDES[0],
        "max_side": ANY_SIDES[1],
        "pooler_strides": strides,
        "pooler_scales": [pooler_scales(feature_heights(height, row), height) for row in strides],
    }


def import_detector(
    model,
    image_sizes=None,
    *,
    layout: str = "NHWC",
    offset_trick_max_numel: int = 4000,
    float64: bool = True,
):
    """``(IRModule, metadata)`` of ``model`` (a torchvision detector, or a program exported with
    :func:`~tvm_roialign.frontend.detection.export_detector`): for ``image_sizes`` None or
    ``"any"``, one function ``detect`` for every padded size (metadata ``any_size``); else one
    function per padded size of :func:`bucket_sizes` (``detect_<Hp>x<Wp>``, metadata
    ``buckets``). ``float64=False`` for targets without float64 (Metal)."""
    import torch

    from ..frontend.detection import from_exported_program
    from ..frontend.static_rcnn import torch_bilinear_fused
    from ..passes import ConvertLayout
    from ..runtime.transform import TransformSettings
    from ._torch_rewrites import tvm_friendly

    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if isinstance(model, torch.export.ExportedProgram):
        meta = program_metadata(model)
        functions = {meta["buckets"][0]["function"]: from_exported_program(
            model, keep_params_as_input=False
        )["main"]}
    else:
        functions, buckets, any_size = {}, [], None
        sizes = [ANY] if image_sizes in (None, ANY) else bucket_sizes(model.transform, image_sizes)
        with tvm_friendly(model):
            for padded in sizes:
                func, entry, static = _import_one(
                    model, padded, offset_trick_max_numel=offset_trick_max_numel, float64=float64
                )
                functions[entry["function"]] = func
                if padded == ANY:
                    any_size = entry
                else:
                    buckets.append(entry)
        meta = {
            "outputs": static.output_names(),
            "buckets": buckets,
            **({"any_size": any_size} if any_size else {}),
            "transform": TransformSettings.of(
                model.transform, torch_bilinear_fused(30, 57)
            ).to_dict(),
            "max_detections": static.num_detections,
            "proposals": static.num_proposals,
            "score_threshold": float(model.roi_heads.score_thresh),
            **detector_names(model),
            "offset_trick_max_numel": int(offset_trick_max_numel),
        }
    mod = tvm.IRModule(
        {name: func.with_attr("global_symbol", name) for name, func in functions.items()}
    )
    # NumPy folds the weights' layout changes and arithmetic (FoldConstant compiles each such call)
    fold = tvm.transform.Sequential([FoldConstantNumPy(), FoldConstantIfFoldable()])
    mod = fold(mod)
    if layout == "NHWC":
        mod = fold(ConvertLayout(desired_layouts(layout))(mod))
    return mod, meta


def program_metadata(program) -> dict:
    """Metadata of a detector program loaded from a ``.pt2`` (its padded size, transform and
    output names, from :func:`~tvm_roialign.frontend.detection.export_detector`)."""
    from ..frontend.detection import settings_of_tensor

    placeholders = [
        spec
        for spec in program.graph_signature.input_specs
        if spec.kind.name == "USER_INPUT"
    ]
    outputs = list(program.graph_signature.output_specs)
    ops = {
        str(node.target) for node in program.graph.nodes if node.op == "call_function"
    }
    state = program.state_dict
    if (
        len(placeholders) != 2
        or "tvm_roialign.batched_nms.default" not in ops
        or "transform_settings" not in state
    ):
        raise ValueError(
            "the program is not a detector exported with tvm_roialign.frontend.detection."
            "export_detector (images and image_size inputs, tvm_roialign::batched_nms expected)"
        )
    images = list(program.graph.find_nodes(op="placeholder"))[-2]
    padded = [int(d) for d in images.meta["val"].shape[-2:]]
    (returned,) = program.graph.find_nodes(op="output")
    ranks = [node.meta["val"].dim() for node in returned.args[0]]
    if len(ranks) != len(outputs):
        raise ValueError("the program's outputs are not a detector's (boxes, scores, labels, ...)")
    extra = {4: "masks", 5: "keypoint_heatmaps"}
    names = ["boxes", "scores", "labels", *(extra.get(r, "?") for r in ranks[3:-1]), "num_detections"]
    bucket = {
        "padded": padded,
        "function": function_name(padded),
        "min_resized_height": int(state["min_resized_height"]),
    }
    return {
        "outputs": names,
        "buckets": [bucket],
        "transform": settings_of_tensor(state["transform_settings"]),
        "categories": None,
    }


__all__ = ["import_detector", "program_metadata"]
