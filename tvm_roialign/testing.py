"""Test helpers: an independent float64 NumPy reference of RoIAlign, and small build/run utilities.

:func:`roi_align_ref` is written from the semantics in :mod:`tvm_roialign.topi.roi_align`'s module
docstring with plain loops, in float64; it shares no code with the TE compute. So are the references
of the RoI family, :func:`ps_roi_align_ref` (torchvision ``ps_roi_align``) and
:func:`roi_align_rotated_ref`, whose conventions are:

==========================  ==============  ==============  =========  ==============================
system                      ``angle_unit``  ``clockwise``   ``aligned``  shift / size clamp
==========================  ==============  ==============  =========  ==============================
detectron2 ROIAlignRotated  ``"degrees"``   False           True       centre - 0.5; none
mmcv RoIAlignRotated        ``"radians"``   its flag        its flag   True: centre - 0.5, none;
                                                                       False: no shift, sizes >= 1
OpenVINO ROIAlignRotated    ``"radians"``   clockwise_mode  True       centre - 0.5; none
==========================  ==============  ==============  =========  ==============================

A sample ``(yy, xx)`` of the axis-aligned grid of a ``w x h`` box centred on 0 (RoIAlign's bins and
samples, ``start = -size / 2``) is read at ``y = yy cos t - xx sin t + cy``, ``x = yy sin t + xx cos
t + cx`` (``t`` the angle in radians, negated when clockwise), then bilinearly as RoIAlign.
"""

from __future__ import annotations

import math

import numpy as np

from .precision.policy import generic_int8  # noqa: F401 - the int8 tests' reference builds
from .topi._sampling import MAX_ADAPTIVE_GRID


def _bilinear_terms(plane, y, x):
    """The four weighted corner terms of sampling ``plane [H, W, C]`` at (y, x), or None (outside).

    ``plane`` is float64 with channels last so that every channel is sampled at once.
    """
    height, width = plane.shape[0], plane.shape[1]
    if not (y >= -1.0 and y <= height and x >= -1.0 and x <= width):  # NaN fails too
        return None
    real = type(y)  # the coordinate precision (float, or np.float32 to mimic float32 kernels)
    y = max(y, real(0.0))
    x = max(x, real(0.0))
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_low = y_high = height - 1
        y = real(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_low = x_high = width - 1
        x = real(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - real(y_low), x - real(x_low)
    hy, hx = real(1.0) - ly, real(1.0) - lx
    return (
        hy * hx * plane[y_low, x_low],
        hy * lx * plane[y_low, x_high],
        ly * hx * plane[y_high, x_low],
        ly * lx * plane[y_high, x_high],
    )


def _grid(size_over_pooled, sampling_ratio):
    if sampling_ratio > 0:
        return sampling_ratio
    if not (size_over_pooled > 0 and math.isfinite(size_over_pooled)):
        return 0
    return int(min(math.ceil(size_over_pooled), MAX_ADAPTIVE_GRID))


def roi_align_ref(
    data,
    rois,
    pooled_size,
    spatial_scale=1.0,
    sampling_ratio=-1,
    aligned=False,
    layout="NCHW",
    mode="avg",
    half_pixel=False,
    coord_dtype="float64",
):
    """Float64 RoIAlign with plain loops.

    Parameters
    ----------
    data : ndarray
        ``[N, C, H, W]`` (NCHW) or ``[N, H, W, C]`` (NHWC).
    rois : ndarray
        ``[K, 5]`` of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels.
    pooled_size : int or (int, int)
    spatial_scale, sampling_ratio, aligned, layout, mode
        As ``relax.vision.roi_align`` (``aligned`` only drops the >= 1 clamp; modes ``avg``,
        ``max``, ``onnx_max``).
    half_pixel : bool
        Subtract 0.5 after scaling (torchvision's ``aligned=True`` and ONNX ``half_pixel``).
    coord_dtype : str
        Precision of the sampling geometry (coordinates, grid, weights): ``"float64"``, or
        ``"float32"`` to round them as a float32 kernel does (torchvision's CPU kernel computes
        them in the data type), so that a sample exactly on a boundary (``y == -1``) falls on
        the same side. Values are always accumulated in float64.

    Returns
    -------
    ndarray
        float64 ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC).
    """
    ph_count, pw_count = (pooled_size, pooled_size) if np.isscalar(pooled_size) else pooled_size
    data = np.asarray(data, dtype=np.float64)
    rois = np.asarray(rois, dtype=np.float64)
    maps = data if layout == "NHWC" else data.transpose(0, 2, 3, 1)  # [N, H, W, C]
    num_batch, _, _, channels = maps.shape
    out = np.zeros((rois.shape[0], ph_count, pw_count, channels))
    real = np.dtype(coord_dtype).type
    offset = real(0.5 if half_pixel else 0.0)
    scale = real(spatial_scale)
    for k, roi in enumerate(rois):
        batch = roi[0]
        if not (batch > -1 and batch < num_batch and np.isfinite(roi[1:]).all()):
            continue  # a batch index outside [0, N) or a non-finite coordinate: a row of zeros
        plane = maps[int(batch)]
        x1, y1, x2, y2 = (real(v) * scale - offset for v in roi[1:])
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, real(1.0)), max(roi_h, real(1.0))
        bin_h, bin_w = roi_h / real(ph_count), roi_w / real(pw_count)
        grid_h = _grid(float(bin_h), sampling_ratio)
        grid_w = _grid(float(bin_w), sampling_ratio)
        for ph in range(ph_count):
            for pw in range(pw_count):
                values = []
                for iy in range(grid_h):
                    y = y1 + real(ph) * bin_h + (real(iy) + real(0.5)) * bin_h / real(grid_h)
                    for ix in range(grid_w):
                        x = x1 + real(pw) * bin_w + (real(ix) + real(0.5)) * bin_w / real(grid_w)
                        terms = _bilinear_terms(plane, y, x)
                        if terms is None:
                            values.append(np.zeros(channels))
                        elif mode == "onnx_max":
                            values.append(np.max(terms, axis=0))
                        else:
                            values.append(np.sum(terms, axis=0))
                if not values:
                    continue
                if mode == "avg":
                    out[k, ph, pw] = np.sum(values, axis=0) / max(grid_h * grid_w, 1)
                else:
                    out[k, ph, pw] = np.max(values, axis=0)
    return out if layout == "NHWC" else out.transpose(0, 3, 1, 2)


def _pool_bins(plane_of, pooled, grid, point):
    """``[PH, PW, C]``: the average over each bin's ``grid_h x grid_w`` samples, sample ``(iy, ix)``
    of bin ``(ph, pw)`` read from ``plane_of(ph, pw) [H, W, C]`` at ``point(ph, pw, iy, ix) -> (y,
    x)``."""
    (ph_count, pw_count), (grid_h, grid_w) = pooled, grid
    out = None
    for ph in range(ph_count):
        for pw in range(pw_count):
            plane = plane_of(ph, pw)
            if out is None:
                out = np.zeros((ph_count, pw_count, plane.shape[2]))
            for iy in range(grid_h):
                for ix in range(grid_w):
                    terms = _bilinear_terms(plane, *point(ph, pw, iy, ix))
                    if terms is not None:
                        out[ph, pw] += np.sum(terms, axis=0)
            out[ph, pw] /= max(grid_h * grid_w, 1)
    return out


def _axis_aligned_points(start_h, start_w, bin_h, bin_w, grid):
    """RoIAlign's sample positions: ``point(ph, pw, iy, ix) -> (y, x)``."""

    def point(ph, pw, iy, ix):
        return (
            start_h + ph * bin_h + (iy + 0.5) * bin_h / grid[0],
            start_w + pw * bin_w + (ix + 0.5) * bin_w / grid[1],
        )

    return point


def _pooled_pair(pooled_size):
    return (pooled_size, pooled_size) if np.isscalar(pooled_size) else tuple(pooled_size)


def _maps(data, layout):
    data = np.asarray(data, dtype=np.float64)
    return data if layout == "NHWC" else data.transpose(0, 2, 3, 1)  # [N, H, W, C]


def _roi_ok(roi, num_batch):
    return bool(roi[0] > -1 and roi[0] < num_batch and np.isfinite(roi[1:]).all())


def ps_roi_align_ref(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1, layout="NCHW"):
    """Float64 position-sensitive RoIAlign (torchvision ``ps_roi_align``) with plain loops.

    ``data [N, C * PH * PW, H, W]`` (NCHW) or ``[N, H, W, C * PH * PW]`` (NHWC), ``rois [K, 5]``;
    output channel ``c`` of bin ``(ph, pw)`` averages input channel ``(c * PH + ph) * PW + pw``.
    Geometry: ``start = x1 * scale - 0.5``, no size clamp; an empty grid, a non-finite coordinate
    or a batch index outside ``[0, N)`` gives 0. Returns float64 ``[K, C, PH, PW]`` / ``[K, PH, PW,
    C]``.
    """
    ph_count, pw_count = _pooled_pair(pooled_size)
    maps = _maps(data, layout)
    rois = np.asarray(rois, dtype=np.float64)
    channels = maps.shape[3] // (ph_count * pw_count)
    # input channel (c * PH + ph) * PW + pw -> [PH, PW, C]
    mapped = maps.reshape(*maps.shape[:3], channels, ph_count, pw_count)
    out = np.zeros((rois.shape[0], ph_count, pw_count, channels))
    for k, roi in enumerate(rois):
        if not _roi_ok(roi, maps.shape[0]):
            continue
        x1, y1, x2, y2 = (v * spatial_scale - 0.5 for v in roi[1:])
        bin_h, bin_w = (y2 - y1) / ph_count, (x2 - x1) / pw_count
        grid = (_grid(bin_h, sampling_ratio), _grid(bin_w, sampling_ratio))
        point = _axis_aligned_points(y1, x1, bin_h, bin_w, grid)
        out[k] = _pool_bins(lambda ph, pw, b=int(roi[0]): mapped[b, :, :, :, ph, pw],
                            (ph_count, pw_count), grid, point)
    return out if layout == "NHWC" else out.transpose(0, 3, 1, 2)


def roi_align_rotated_ref(
    data,
    rois,
    pooled_size,
    spatial_scale=1.0,
    sampling_ratio=-1,
    aligned=True,
    clockwise=False,
    angle_unit="degrees",
    layout="NCHW",
):
    """Float64 rotated RoIAlign with plain loops (conventions: module docstring).

    ``rois [K, 6]`` of ``(batch_index, cx, cy, w, h, angle)``. Returns float64 ``[K, C, PH, PW]``
    (NCHW) or ``[K, PH, PW, C]`` (NHWC); an empty grid, a non-finite coordinate or angle, or a
    batch index outside ``[0, N)`` gives 0.
    """
    pooled = _pooled_pair(pooled_size)
    maps = _maps(data, layout)
    rois = np.asarray(rois, dtype=np.float64)
    out = np.zeros((rois.shape[0], *pooled, maps.shape[3]))
    offset = 0.5 if aligned else 0.0
    for k, roi in enumerate(rois):
        if not _roi_ok(roi, maps.shape[0]):
            continue
        cx, cy = roi[1] * spatial_scale - offset, roi[2] * spatial_scale - offset
        width, height = roi[3] * spatial_scale, roi[4] * spatial_scale
        if not aligned:
            width, height = max(width, 1.0), max(height, 1.0)
        theta = roi[5] * (math.pi / 180.0 if angle_unit == "degrees" else 1.0)
        theta = -theta if clockwise else theta
        cos, sin = math.cos(theta), math.sin(theta)
        bin_h, bin_w = height / pooled[0], width / pooled[1]
        grid = (_grid(bin_h, sampling_ratio), _grid(bin_w, sampling_ratio))
        local = _axis_aligned_points(-height / 2, -width / 2, bin_h, bin_w, grid)

        def point(ph, pw, iy, ix, local=local, cos=cos, sin=sin, cx=cx, cy=cy):
            yy, xx = local(ph, pw, iy, ix)
            return yy * cos - xx * sin + cy, yy * sin + xx * cos + cx

        out[k] = _pool_bins(lambda ph, pw, b=int(roi[0]): maps[b], pooled, grid, point)
    return out if layout == "NHWC" else out.transpose(0, 3, 1, 2)


def single_op_module(build, **inputs):
    """An IRModule ``main(**inputs)`` whose one dataflow block emits ``build(*params)``.

    ``inputs`` map parameter names, in order, to ``(shape, dtype)`` or a ``relax.TensorType``;
    ``build`` takes the parameters (``relax.Var``) and returns a Relax expression, or a list of them
    (the function then returns a tuple).

    Example::

        mod = single_op_module(lambda d, r: relax.op.vision.roi_align(d, r, (2, 2), 1.0),
                               data=([1, 4, 8, 8], "float32"), rois=([3, 5], "float32"))
    """
    from tvm import relax

    params = []
    for name, spec in inputs.items():
        ty = spec if isinstance(spec, relax.TensorType) else relax.TensorType(list(spec[0]), spec[1])
        params.append(relax.Var(name, ty))
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            result = build(*params)
            if isinstance(result, (list, tuple)):
                result = relax.Tuple([bb.emit(r) for r in result])
            out = bb.emit_output(bb.emit(result) if isinstance(result, relax.Call) else result)
        bb.emit_func_output(out)
    return bb.get()


def build_roi_align_module(
    data_shape,
    num_rois,
    pooled_size,
    spatial_scale=1.0,
    sampling_ratio=-1,
    aligned=False,
    layout="NCHW",
    mode="avg",
    dtype="float32",
    torchvision_aligned=False,
    rois_dtype=None,
):
    """An IRModule ``main(data, rois)`` with one ``relax.vision.roi_align`` call (rois in
    ``rois_dtype``, default ``dtype``).

    ``torchvision_aligned`` builds it with :func:`tvm_roialign.roi_align` (torchvision's meaning of
    ``aligned``); otherwise the plain Relax op with the op's own meaning.
    """
    from tvm import relax

    from .ops.roi_align import make_roi_align

    def make(data, rois):
        if torchvision_aligned:
            return make_roi_align(
                data, rois, pooled_size, spatial_scale=spatial_scale,
                sampling_ratio=sampling_ratio, aligned=aligned, layout=layout, mode=mode,
            )
        return relax.op.vision.roi_align(
            data, rois, pooled_size, spatial_scale, sampling_ratio, aligned, layout, mode
        )

    return single_op_module(
        make,
        data=(data_shape, dtype),
        rois=([num_rois, 5], rois_dtype or dtype),
    )


def compiled(mod, target=None, func_name="main"):
    """Build ``mod`` once with ``tvm.compile`` for ``target`` (host llvm by default): a function
    that runs it on CPU for a list of inputs (as :func:`compile_and_run` returns its outputs), so
    that one build serves several input sets (a symbolic dimension at several values)."""
    import tvm
    from tvm import relax

    target = target or tvm.target.Target({"kind": "llvm"})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    return lambda inputs: run_executable(vm, *inputs, function=func_name)


def run_executable(executable, *arrays, function: str = "main"):
    """``function`` of ``executable`` (a ``tvm.compile`` result, or a Relax VM made of one) run on
    CPU on ``arrays`` (NumPy): a NumPy array for a tensor result, a list of them for a tuple. The
    tests' one way to run a build."""
    import tvm
    from tvm import relax

    if isinstance(executable, relax.VirtualMachine):
        vm = executable
    else:
        vm = relax.VirtualMachine(executable, tvm.cpu())
    result = vm[function](*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays])
    if isinstance(result, (list, tuple)) or (hasattr(result, "__len__") and not hasattr(result, "numpy")):
        return [r.numpy() for r in result]
    return result.numpy()


def run_first(executable, *arrays, function: str = "main") -> np.ndarray:
    """The result of :func:`run_executable`, or the first field of a tuple result."""
    out = run_executable(executable, *arrays, function=function)
    return out[0] if isinstance(out, list) else out


def compile_and_run(mod, inputs, target=None, func_name="main"):
    """Build ``mod`` with ``tvm.compile`` for ``target`` (host llvm by default) and run it on CPU."""
    return compiled(mod, target, func_name)(inputs)


def smooth_data(shape, dtype="float32"):
    """A smooth NCHW map of ``shape [N, C, H, W]``: ulp-level differences of sample coordinates
    (float32 vs float64 geometry) move sampled values by less than 1e-6."""
    n, c, y, x = np.meshgrid(*(np.arange(d) for d in shape), indexing="ij")
    return (np.sin(0.35 * y + 0.25 * x + 0.7 * c + n) * np.cos(0.2 * x - 0.1 * y)).astype(dtype)


def run_roi_align_vm(vm, data_nchw, rois, layout, func_name="main"):
    """Run ``vm[func_name](data, rois)`` with NCHW ``data_nchw`` given in ``layout``; the result
    comes back as NCHW ``[K, C, PH, PW]``."""
    import tvm

    data = data_nchw if layout == "NCHW" else data_nchw.transpose(0, 2, 3, 1)
    out = vm[func_name](
        tvm.runtime.tensor(np.ascontiguousarray(data)), tvm.runtime.tensor(rois)
    ).numpy()
    return out if layout == "NCHW" else out.transpose(0, 3, 1, 2)


def guarded_array(values, guard="after"):
    """A copy of ``values`` placed right before (``guard="after"``) or right after
    (``guard="before"``) an inaccessible memory page, so that a kernel reading one element past
    its end (or before its start) crashes instead of reading whatever lies there.

    Returns ``(array, keep)``: the array (C-contiguous, 64-byte aligned, so that
    ``tvm.runtime.from_dlpack`` takes it without a copy) and the mapping that must stay alive as
    long as the array is used. ``values.nbytes`` must be a multiple of 64 for ``"after"``
    (TVM's alignment); Linux only.
    """
    import ctypes
    import mmap

    values = np.ascontiguousarray(values)
    page = mmap.PAGESIZE
    if guard not in ("after", "before"):
        raise ValueError(f"guard must be 'after' or 'before', got {guard!r}")
    if guard == "after" and values.nbytes % 64:
        raise ValueError(f"values.nbytes must be a multiple of 64, got {values.nbytes}")
    pages = max(-(-values.nbytes // page), 1)
    mapping = mmap.mmap(-1, (pages + 2) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    mprotect = ctypes.CDLL(None, use_errno=True).mprotect
    mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for start in (base, base + (pages + 1) * page):  # PROT_NONE around the data pages
        if mprotect(start, page, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
    offset = page + (pages * page - values.nbytes if guard == "after" else 0)
    array = np.frombuffer(mapping, values.dtype, values.size, offset).reshape(values.shape)
    array[...] = values
    return array, mapping


def op_calls(mod, name: str) -> list:
    """The calls of the Relax op ``name`` (e.g. ``"relax.nn.conv2d"``) bound in the dataflow of
    ``mod``'s Relax functions, in order."""
    from tvm import relax

    return [
        binding.value
        for func in mod.functions.values()
        if isinstance(func, relax.Function)
        for block in func.body.blocks
        for binding in block.bindings
        if isinstance(binding.value, relax.Call) and getattr(binding.value.op, "name", "") == name
    ]
