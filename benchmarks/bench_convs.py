"""Per-kernel fp32 convolutions and matmuls: the package's default rules against PyTorch, one run.

    python benchmarks/bench_convs.py [--repeat 7] [--only 3x3,fc6] [--threads N] [--winograd 0]
                                     [--symbolic] [--baseline CHECKOUT] [--out benchmarks/results]

The distinct conv / matmul shapes of Mask R-CNN's backbone, FPN and heads at 512x512 and of resnet50
at 224x224, plus the grouped convs of ResNeXt 50 (32x4d) and depthwise convs (MobileNet v2,
ConvNeXt). Each kernel is a Relax module ``relu(conv2d(x, w) + b)`` (NHWC data, HWIO constant
weights, as the pipeline's layout conversion leaves a model) or ``relu(x @ w + b)``, built with
:func:`tvm_roialign.pipeline.build` for this machine's CPU with the default options except Winograd
(``--winograd``, 0 by default: the direct rules), with static shapes (``--symbolic``: the height and
width, or a matmul's rows, symbolic as in an any-size model). ``--baseline`` times another
checkout's build of each kernel in the same rounds (built in a subprocess with that checkout first
on ``PYTHONPATH``). PyTorch runs the same op in ``channels_last`` on the same thread count.

The timing is interleaved: each round times every kernel's TVM, PyTorch (and baseline) calls back to
back, starting with a different one each round, with a pause before each batch of calls (so that
the other runtime's idle threads have stopped spinning); a kernel's time is the median over the
rounds. Prints ms, GFLOP/s and the ratio (PyTorch's time over TVM's: above 1, TVM is faster) per
kernel and the geometric mean per kind; writes ``bench_convs.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    """A conv (``k`` > 0: NHWC ``[n, h, w, cin]`` -> ``cout``, ``k x k``, ``stride``, ``groups``)
    or a matmul (``k`` == 0: ``[n, cin] x [cin, cout]``)."""

    name: str
    kind: str
    n: int
    h: int
    w: int
    cin: int
    cout: int
    k: int = 1
    stride: int = 1
    groups: int = 1

    @property
    def out_hw(self) -> tuple[int, int]:
        pad = self.k // 2
        return tuple((side + 2 * pad - self.k) // self.stride + 1 for side in (self.h, self.w))

    @property
    def gflop(self) -> float:
        if self.k == 0:
            return 2 * self.n * self.cin * self.cout / 1e9
        ho, wo = self.out_hw
        return 2 * self.n * ho * wo * self.cout * self.k * self.k * self.cin / self.groups / 1e9


def _conv(name, kind, n, hw, cin, cout, k=1, stride=1, groups=1):
    return Shape(name, kind, n, hw, hw, cin, cout, k, stride, groups)


SHAPES = [
    # Mask R-CNN resnet50-FPN at 512x512
    _conv("mrcnn stem", "7x7 s2", 1, 512, 3, 64, 7, 2),
    _conv("mrcnn l1 1x1 64>64", "1x1 s1", 1, 128, 64, 64),
    _conv("mrcnn l1 3x3 64", "3x3 s1 wide", 1, 128, 64, 64, 3),
    _conv("mrcnn l1 1x1 64>256", "1x1 s1", 1, 128, 64, 256),
    _conv("mrcnn l1 1x1 256>64", "1x1 s1", 1, 128, 256, 64),
    _conv("mrcnn l2 3x3 s2 128", "3x3 s2", 1, 128, 128, 128, 3, 2),
    _conv("mrcnn l2 ds 1x1 s2", "1x1 s2", 1, 128, 256, 512, 1, 2),
    _conv("mrcnn l2 3x3 128", "3x3 s1 wide", 1, 64, 128, 128, 3),
    _conv("mrcnn l3 3x3 256", "3x3 s1 small", 1, 32, 256, 256, 3),
    _conv("mrcnn l3 1x1 1024>256", "1x1 s1", 1, 32, 1024, 256),
    _conv("mrcnn l4 3x3 512", "3x3 s1 small", 1, 16, 512, 512, 3),
    _conv("mrcnn l4 1x1 512>2048", "1x1 s1", 1, 16, 512, 2048),
    _conv("mrcnn fpn P2 3x3", "3x3 s1 wide", 1, 128, 256, 256, 3),
    _conv("mrcnn rpn 1x1 256>3", "1x1 s1", 1, 128, 256, 3),
    _conv("mrcnn mask 3x3", "3x3 s1 small", 100, 14, 256, 256, 3),
    _conv("mrcnn mask 1x1 256>91", "1x1 s1", 100, 28, 256, 91),
    # the mask predictor's 2x2 / stride-2 transposed conv, as the 1x1 conv it is rewritten to
    _conv("mrcnn mask 1x1 256>1024", "1x1 s1", 100, 14, 256, 1024),
    # Keypoint R-CNN's head: eight of these on 100 maps of 14 x 14
    _conv("krcnn keypoint 3x3 512", "3x3 s1 small", 100, 14, 512, 512, 3),
    Shape("mrcnn fc6", "matmul", 1000, 0, 0, 12544, 1024, 0),
    Shape("mrcnn fc7", "matmul", 1000, 0, 0, 1024, 1024, 0),
    # resnet50 at 224x224
    _conv("r50 stem", "7x7 s2", 1, 224, 3, 64, 7, 2),
    _conv("r50 l1 3x3 64", "3x3 s1 wide", 1, 56, 64, 64, 3),
    _conv("r50 l3 3x3 256", "3x3 s1 small", 1, 14, 256, 256, 3),
    _conv("r50 l4 3x3 512", "3x3 s1 small", 1, 7, 512, 512, 3),
    _conv("r50 l1 1x1 64>256", "1x1 s1", 1, 56, 64, 256),
    _conv("r50 l1 1x1 256>64", "1x1 s1", 1, 56, 256, 64),
    _conv("r50 l2 1x1 128>512", "1x1 s1", 1, 28, 128, 512),
    _conv("r50 l2 1x1 512>128", "1x1 s1", 1, 28, 512, 128),
    _conv("r50 l3 1x1 256>1024", "1x1 s1", 1, 14, 256, 1024),
    _conv("r50 l3 1x1 1024>256", "1x1 s1", 1, 14, 1024, 256),
    _conv("r50 l4 1x1 512>2048", "1x1 s1", 1, 7, 512, 2048),
    _conv("r50 l4 1x1 2048>512", "1x1 s1", 1, 7, 2048, 512),
    _conv("r50 l3 ds 1x1 s2", "1x1 s2", 1, 28, 512, 1024, 1, 2),
    Shape("r50 fc", "matmul", 1, 0, 0, 2048, 1000, 0),
    # grouped and depthwise
    # resnext50_32x4d at 224: the 3x3 conv of each stage (4, 8, 16, 32 channels per group)
    _conv("resnext l1 3x3 g32", "grouped", 1, 56, 128, 128, 3, 1, 32),
    _conv("resnext l2 3x3 g32", "grouped", 1, 28, 256, 256, 3, 1, 32),
    _conv("resnext l3 3x3 g32", "grouped", 1, 14, 512, 512, 3, 1, 32),
    _conv("resnext l4 3x3 g32", "grouped", 1, 7, 1024, 1024, 3, 1, 32),
    _conv("mbv2 dw 3x3 144", "depthwise", 1, 56, 144, 144, 3, 1, 144),
    # pointwise convs of EfficientNet b0 / MobileNet v3 (channels not multiples of 16)
    _conv("effnet 1x1 16>96", "1x1 s1", 1, 112, 16, 96),
    _conv("effnet 1x1 112>672", "1x1 s1", 1, 14, 112, 672),
    _conv("effnet 1x1 192>1152", "1x1 s1", 1, 7, 192, 1152),
    _conv("mbv3 1x1 160>960", "1x1 s1", 1, 7, 160, 960),
    _conv("convnext dw 7x7 96", "depthwise", 1, 56, 96, 96, 7, 1, 96),
    # depthwise convs of MobileNet v2 / v3 and EfficientNet b0 (strided, 5x5, narrow images)
    _conv("mbv2 dw 3x3 s2 96", "depthwise", 1, 112, 96, 96, 3, 2, 96),
    _conv("mbv2 dw 3x3 32", "depthwise", 1, 112, 32, 32, 3, 1, 32),
    _conv("mbv2 dw 3x3 576", "depthwise", 1, 14, 576, 576, 3, 1, 576),
    _conv("effnet dw 5x5 s2 144", "depthwise", 1, 56, 144, 144, 5, 2, 144),
    _conv("effnet dw 5x5 672", "depthwise", 1, 14, 672, 672, 5, 1, 672),
    _conv("mbv3 dw 5x5 960", "depthwise", 1, 7, 960, 960, 5, 1, 960),
]


def relax_module(s: Shape, weight: np.ndarray, bias: np.ndarray, symbolic: bool = False):
    """``main(x)`` = ``relu(op(x, weight) + bias)`` (see the module docstring); ``symbolic``: the
    rows (matmul) or the height and width (conv) of ``x`` are symbolic."""
    from tvm import relax, tirx

    bb = relax.BlockBuilder()
    shape = [s.n, s.cin] if s.k == 0 else [s.n, s.h, s.w, s.cin]
    if symbolic:
        names = {0: "m"} if s.k == 0 else {1: "h", 2: "w"}
        shape = [tirx.Var(names[i], "int64") if i in names else d for i, d in enumerate(shape)]
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if s.k == 0:
                y = bb.emit(relax.op.matmul(x, relax.const(weight)))
            else:
                pad = s.k // 2
                y = bb.emit(
                    relax.op.nn.conv2d(
                        x, relax.const(weight), strides=s.stride, padding=pad, groups=s.groups,
                        data_layout="NHWC", kernel_layout="HWIO",
                    )
                )
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(bias))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


#: pause before each timed batch (OpenMP's and TVM's idle threads spin for a while after a call)
_PAUSE_S = 0.05


def _time_ms(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1e3 * (time.perf_counter() - start) / calls


def _operands(s: Shape):
    """The input, weight and bias of kernel ``s`` (random, the same in every process)."""
    rng = np.random.default_rng(zlib.crc32(s.name.encode()))
    if s.k == 0:
        x = rng.standard_normal((s.n, s.cin)).astype("float32")
        w = (rng.standard_normal((s.cin, s.cout)) / math.sqrt(s.cin)).astype("float32")
    else:
        x = rng.standard_normal((s.n, s.h, s.w, s.cin)).astype("float32")
        fan_in = s.k * s.k * s.cin // s.groups
        w = (rng.standard_normal((s.k, s.k, s.cin // s.groups, s.cout)) / math.sqrt(fan_in)).astype("float32")
    return x, w, rng.standard_normal(s.cout).astype("float32")


def _build(s: Shape, target, options: dict):
    """``options``: ``winograd`` (the pipeline's) and ``symbolic`` (:func:`relax_module`'s)."""
    from tvm_roialign.pipeline import build

    _, w, b = _operands(s)
    mod = relax_module(s, w, b, options["symbolic"])
    return build(mod, target, winograd=options["winograd"]).executable


def _library_name(s: Shape) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in s.name) + ".so"


def _export_all(shapes, target, options: dict, folder: str) -> None:
    """Build every kernel and export its library into ``folder`` (the ``--baseline`` side)."""
    for s in shapes:
        _build(s, target, options).export_library(os.path.join(folder, _library_name(s)))


def _baseline_calls(shapes, baseline: str, options: dict, folder: str, only: str) -> dict:
    """Kernel name -> a call of its build by the package at ``baseline`` (built in a subprocess)."""
    import subprocess

    import tvm
    from tvm import relax

    env = dict(os.environ, PYTHONPATH=baseline)
    cmd = [sys.executable, __file__, "--export-to", folder, "--winograd", str(options["winograd"]),
           "--only", only] + (["--symbolic"] if options["symbolic"] else [])
    subprocess.run(cmd, env=env, check=True)
    calls = {}
    for s in shapes:
        vm = relax.VirtualMachine(tvm.runtime.load_module(os.path.join(folder, _library_name(s))), tvm.cpu())
        xt = tvm.runtime.tensor(_operands(s)[0])
        calls[s.name] = functools.partial(lambda vm, xt: vm["main"](xt), vm, xt)
    return calls


def _prepare(s: Shape, target, options: dict):
    """``(tvm_call, torch_call, max |tvm - torch|)`` for one kernel."""
    import torch
    import tvm
    from tvm import relax

    x, w, b = _operands(s)
    vm = relax.VirtualMachine(_build(s, target, options), tvm.cpu())
    xt = tvm.runtime.tensor(x)
    bias = torch.from_numpy(b)
    if s.k == 0:
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)

        def torch_call():
            return torch.relu(torch.addmm(bias, tx, tw))
    else:
        tx = torch.from_numpy(x).permute(0, 3, 1, 2)  # an NCHW view of channels_last memory
        tw = torch.from_numpy(np.ascontiguousarray(w.transpose(3, 2, 0, 1))).to(
            memory_format=torch.channels_last
        )
        pad = s.k // 2

        def torch_call():
            y = torch.nn.functional.conv2d(tx, tw, bias, s.stride, pad, 1, s.groups)
            return torch.relu(y)

    def tvm_call():
        return vm["main"](xt)

    ours = tvm_call().numpy()
    ref = torch_call().detach()
    ref = ref.numpy() if s.k == 0 else ref.permute(0, 2, 3, 1).numpy()
    return tvm_call, torch_call, float(np.abs(ours - ref).max())


def _measure(kernels: dict, repeat: int, budget_ms: float) -> dict:
    """Interleaved rounds over ``kernels`` (name -> list of calls: TVM, PyTorch[, baseline]): per
    round and kernel, each call's batch back to back; the median ms per kernel and call."""
    batches = {}
    for name, calls in kernels.items():
        for call in calls:
            call()  # warm-up
        once = max(max(_time_ms(call, 1) for call in calls), 0.01)
        batches[name] = max(1, int(budget_ms / once))
    times = {name: [[] for _ in calls] for name, calls in kernels.items()}
    for round_ in range(repeat):
        for name, calls in kernels.items():
            # each round starts with another runtime; a pause lets the previous runtime's idle
            # threads stop spinning before the next one is timed
            for k in range(len(calls)):
                i = (k + round_) % len(calls)
                time.sleep(_PAUSE_S)
                times[name][i].append(_time_ms(calls[i], batches[name]))
    return {name: [statistics.median(t) for t in per_call] for name, per_call in times.items()}


def _geomean(values) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def _report(shapes, medians, errors) -> list[dict]:
    rows, by_kind = [], {}
    base = any(len(m) > 2 for m in medians.values())
    print(f"{'kernel':26} {'kind':13} {'GFLOP':>7} {'tvm ms':>9} {'torch ms':>9} {'tvm GF/s':>9} "
          f"{'torch GF/s':>10} {'ratio':>6}" + (f" {'base ms':>9} {'base ratio':>10}" if base else "")
          + f" {'max|err|':>9}")
    for s in shapes:
        ours, theirs, *before = medians[s.name]
        row = dict(asdict(s), gflop=s.gflop, tvm_ms=ours, torch_ms=theirs, ratio=theirs / ours,
                   max_abs_err=errors[s.name])
        if before:
            row.update(baseline_ms=before[0], baseline_ratio=theirs / before[0])
        rows.append(row)
        by_kind.setdefault(s.kind, []).append(row)
        extra = f" {before[0]:9.3f} {row['baseline_ratio']:10.2f}" if before else ""
        print(f"{s.name:26} {s.kind:13} {s.gflop:7.3f} {ours:9.3f} {theirs:9.3f} "
              f"{s.gflop / ours * 1e3:9.1f} {s.gflop / theirs * 1e3:10.1f} {row['ratio']:6.2f}"
              f"{extra} {row['max_abs_err']:9.1e}")
    print("\nratio (torch ms / tvm ms; above 1: TVM faster), geometric mean per kind:")
    for kind, group in by_kind.items():
        line = f"  {kind:13} {_geomean([r['ratio'] for r in group]):5.2f}"
        if base:
            line += f"  baseline {_geomean([r['baseline_ratio'] for r in group]):5.2f}"
        print(f"{line}  ({len(group)})")
    return rows


def _cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")


def _arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="interleaved rounds (median)")
    parser.add_argument("--only", default="", help="comma-separated substrings of kernel names or kinds")
    parser.add_argument("--winograd", type=int, default=0, help="Winograd tile (0: direct rules)")
    parser.add_argument("--symbolic", action="store_true",
                        help="build with symbolic rows / height and width (as an any-size model)")
    parser.add_argument("--threads", type=int, default=0, help="threads for both (0: every usable core)")
    parser.add_argument("--budget-ms", type=float, default=30.0, help="time per kernel per round")
    parser.add_argument("--baseline", default="", help="a checkout of the package (its folder) "
                        "whose build of each kernel is timed too, in the same rounds")
    parser.add_argument("--export-to", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = _arguments(argv)
    if args.threads:
        os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import torch
    import tvm

    from tvm_roialign.host import usable_cores, use_usable_cores
    from tvm_roialign.target import parse_target

    use_usable_cores()
    threads = int(os.environ.get("TVM_NUM_THREADS") or usable_cores())
    torch.set_num_threads(threads)
    target = parse_target("native")
    keys = [k for k in args.only.split(",") if k]
    shapes = [s for s in SHAPES if not keys or any(k in s.name or k in s.kind for k in keys)]
    options = dict(winograd=args.winograd, symbolic=args.symbolic)
    if args.export_to:
        _export_all(shapes, target, options, args.export_to)
        return 0
    kernels, errors = {}, {}
    with torch.no_grad(), tempfile.TemporaryDirectory(prefix="bench_convs-") as folder:
        for s in shapes:
            print(f"building {s.name} ...", file=sys.stderr, flush=True)
            tvm_call, torch_call, errors[s.name] = _prepare(s, target, options)
            kernels[s.name] = [tvm_call, torch_call]
        if args.baseline:
            print(f"building the baseline's kernels ({args.baseline}) ...", file=sys.stderr, flush=True)
            base = _baseline_calls(shapes, args.baseline, options, folder, args.only)
            for name, call in base.items():
                kernels[name].append(call)
        medians = _measure(kernels, args.repeat, args.budget_ms)
    cpu = _cpu_name()
    print(f"CPU {cpu} (LLVM {target.attrs.get('mcpu')}), {threads} threads, "
          f"median of {args.repeat} interleaved rounds, tvm {tvm.__version__}, torch {torch.__version__}")
    rows = _report(shapes, medians, errors)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(cpu=cpu, mcpu=str(target.attrs.get("mcpu")), threads=threads, repeat=args.repeat,
                winograd=args.winograd, symbolic=args.symbolic, baseline=args.baseline or None,
                tvm=tvm.__version__, torch=torch.__version__)
    (out / "bench_convs.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
