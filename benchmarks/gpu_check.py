"""GPU check of tvm-roialign on CUDA: correctness against torchvision, and speed.

For each case and dtype (float32, float16) it builds our RoIAlign (NCHW and NHWC) through
``tvm.compile`` of a Relax module, compares it with ``torchvision.ops.roi_align`` on the GPU, and
times ours, torchvision and stock TVM (``tvm_roialign.stock_tvm()``; stock TVM 0.27 fails to build
roi_align for CUDA, which is reported as "fails").

Cases (sampling_ratio 2, aligned=False as in torchvision's Faster R-CNN box head):

* A: data 1x256x200x272, 1000 rois inside an 800x1088 image, 7x7, spatial_scale 0.25
* B: same map, 100 rois, 14x14
* C: data 1x256x50x68, spatial_scale 1/16, 1000 rois, 7x7
* batch: data 8x256x200x272, 8000 rois (1000 per image), 7x7, spatial_scale 0.25

"GB/s" is the compulsory traffic (data + rois + output bytes) divided by the time; "x tv" is
torchvision's time over ours (> 1: ours is faster); "max err" is the largest difference from
torchvision run in float32 on the same inputs (for float16 too: torchvision's float16 kernel rounds
box coordinates to float16, ours computes them in float32). Runs in well under 3 minutes on an H100/H200.
Without a CUDA GPU it prints a message and exits with status 0.

Usage: ``python benchmarks/gpu_check.py [--dtypes float32 float16] [--cases A B C batch]``
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import dataclass

IMAGE_H, IMAGE_W = 800, 1088


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    channels: int
    height: int
    width: int
    num_rois: int
    pooled: int
    spatial_scale: float
    sampling_ratio: int = 2


CASES = {
    "A": Case("A", 1, 256, 200, 272, 1000, 7, 0.25),
    "B": Case("B", 1, 256, 200, 272, 100, 14, 0.25),
    "C": Case("C", 1, 256, 50, 68, 1000, 7, 1 / 16),
    "batch": Case("batch", 8, 256, 200, 272, 8000, 7, 0.25),
}


def gpu_available() -> tuple[bool, str]:
    """(available, reason): a CUDA device visible to both torch and TVM."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    import tvm

    if not tvm.cuda(0).exist:
        return False, "TVM sees no CUDA device (TVM runtime without CUDA, or no driver)"
    return True, ""


def make_inputs(case: Case, dtype: str, seed: int = 0):
    """``(data NCHW, rois [K, 5])`` as CUDA torch tensors; boxes lie inside the image."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    data = torch.randn(case.batch, case.channels, case.height, case.width, generator=gen)
    size = torch.tensor([IMAGE_W, IMAGE_H], dtype=torch.float32)
    a = torch.rand(case.num_rois, 2, generator=gen) * size
    b = torch.rand(case.num_rois, 2, generator=gen) * size
    index = torch.arange(case.num_rois) * case.batch // case.num_rois
    rois = torch.cat([index[:, None].float(), torch.minimum(a, b), torch.maximum(a, b)], dim=1)
    torch_dtype = getattr(torch, dtype)
    return data.to(torch_dtype).cuda(), rois.to(torch_dtype).cuda()


def build(case: Case, dtype: str, layout: str, target):
    """A Relax VM running one roi_align for ``case``, or raise what tvm.compile raised."""
    import tvm
    from tvm import relax

    from tvm_roialign.testing import build_roi_align_module

    if layout == "NCHW":
        shape = (case.batch, case.channels, case.height, case.width)
    else:
        shape = (case.batch, case.height, case.width, case.channels)
    mod = build_roi_align_module(shape, case.num_rois, case.pooled, case.spatial_scale,
                                 case.sampling_ratio, False, layout, "avg", dtype)
    return relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cuda(0))


def time_tvm(vm, args, repeat: int) -> float:
    """Median seconds of one call (TVM's time evaluator, after a warm-up call)."""
    import tvm

    vm["main"](*args)
    tvm.cuda(0).sync()
    evaluator = vm.time_evaluator("main", tvm.cuda(0), number=10, repeat=repeat)
    return float(evaluator(*args).median)


def time_torch(fn, repeat: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3 / 10)
    times.sort()
    return times[len(times) // 2]


def traffic_bytes(case: Case, dtype: str) -> int:
    item = 2 if dtype == "float16" else 4
    data = case.batch * case.channels * case.height * case.width
    out = case.num_rois * case.channels * case.pooled * case.pooled
    return (data + out + case.num_rois * 5) * item


def run_case(case: Case, dtype: str, target, repeat: int) -> dict:
    import torch
    import torchvision
    import tvm

    import tvm_roialign

    data, rois = make_inputs(case, dtype)
    to_tvm = lambda t: tvm.runtime.from_dlpack(t.contiguous())
    pooled = (case.pooled, case.pooled)

    def tv():
        return torchvision.ops.roi_align(data, rois, pooled, case.spatial_scale,
                                         case.sampling_ratio, False)

    # the reference: torchvision in float32 on the same (float16-valued) inputs, because
    # torchvision's float16 kernel rounds box coordinates and sample positions to float16
    expected = torchvision.ops.roi_align(data.float(), rois.float(), pooled, case.spatial_scale,
                                         case.sampling_ratio, False)
    row = {"case": case.name, "dtype": dtype, "tv": time_torch(tv, repeat)}
    tol = 1e-4 if dtype == "float32" else 4e-3  # float16: one rounding of the result
    for layout in ("NCHW", "NHWC"):
        vm = build(case, dtype, layout, target)
        x = data if layout == "NCHW" else data.permute(0, 2, 3, 1)
        args = [to_tvm(x), to_tvm(rois)]
        got = torch.from_dlpack(vm["main"](*args)).float()
        if layout == "NHWC":
            got = got.permute(0, 3, 1, 2)
        err = (got - expected).abs().max().item()
        row[f"err_{layout}"] = err
        row[f"ok_{layout}"] = err <= tol * max(1.0, expected.abs().max().item())
        row[layout] = time_tvm(vm, args, repeat)
        del vm
    # stock TVM 0.27: expected to fail in dlight's Reduction rule
    try:
        with tvm_roialign.stock_tvm():
            vm = build(case, dtype, "NCHW", target)
            row["stock"] = time_tvm(vm, [to_tvm(data), to_tvm(rois)], repeat)
    except Exception as err:  # noqa: BLE001 - report, do not crash
        row["stock"] = None
        lines = str(err).strip().splitlines()
        frames = traceback.extract_tb(err.__traceback__)
        where = f" at {'/'.join(frames[-1].filename.split('/')[-3:])}:{frames[-1].lineno}" \
            if frames else ""
        row["stock_error"] = f"{type(err).__name__}{where}: {lines[-1][:80] if lines else ''}"
    row["bytes"] = traffic_bytes(case, dtype)
    return row


def report(rows) -> None:
    headers = ["case", "dtype", "ok", "max err", "tv us", "ours NCHW us", "x tv", "GB/s",
               "ours NHWC us", "x tv", "stock TVM"]
    lines = []
    for r in rows:
        ok = "yes" if r["ok_NCHW"] and r["ok_NHWC"] else "NO"
        stock = "fails" if r["stock"] is None else f"{r['stock'] * 1e6:.1f} us"
        lines.append([
            r["case"], r["dtype"], ok, f"{max(r['err_NCHW'], r['err_NHWC']):.2e}",
            f"{r['tv'] * 1e6:.1f}", f"{r['NCHW'] * 1e6:.1f}", f"{r['tv'] / r['NCHW']:.2f}",
            f"{r['bytes'] / r['NCHW'] / 1e9:.3g}", f"{r['NHWC'] * 1e6:.1f}",
            f"{r['tv'] / r['NHWC']:.2f}", stock,
        ])
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="tvm-roialign on CUDA vs torchvision and stock TVM")
        for h in headers:
            table.add_column(h, justify="right")
        for line in lines:
            table.add_row(*line)
        Console(width=max(160, Console().width)).print(table)
    except ImportError:
        print(" | ".join(headers))
        for line in lines:
            print(" | ".join(line))
    for r in rows:
        if r["stock"] is None:
            print(f"stock TVM, case {r['case']} {r['dtype']}: {r['stock_error']}")
            break
    a32 = [r for r in rows if r["case"] == "A" and r["dtype"] == "float32"]
    if a32:
        ratio = a32[0]["tv"] / a32[0]["NCHW"]
        verdict = "met" if ratio >= 1.5 else "NOT met"
        print(f"shape A float32: ours {ratio:.2f}x torchvision (target >= 1.5x: {verdict})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16"],
                        choices=["float32", "float16"])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats of 10 calls")
    args = parser.parse_args(argv)

    available, reason = gpu_available()
    if not available:
        print(f"gpu_check: no CUDA GPU available ({reason}); nothing to check.")
        return 0

    import torch
    import tvm

    import tvm_roialign  # noqa: F401  (registers the strategies)

    major, minor = torch.cuda.get_device_capability()
    target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}"},
                               host={"kind": "llvm"})
    print(f"device: {torch.cuda.get_device_name()} (sm_{major}{minor})")
    started = time.perf_counter()
    rows = []
    for dtype in args.dtypes:
        for name in args.cases:
            rows.append(run_case(CASES[name], dtype, target, args.repeat))
            print(f"  done {name} {dtype} ({time.perf_counter() - started:.0f} s)", flush=True)
    report(rows)
    failed = [r for r in rows if not (r["ok_NCHW"] and r["ok_NHWC"])]
    print(f"total {time.perf_counter() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
