"""bf16 against fp32, OpenVINO's default precision and PyTorch bf16, in one process, interleaved.

Two workloads: Mask R-CNN's box-head fc6 (``[1000, 12544] x [12544, 1024]`` + bias + ReLU) and
torchvision resnet50 at 1x3x224x224 (random weights, batch-norm statistics from three training
passes). The runners take turns in blocks of calls
of about 0.25 s, round after round (``_common.interleaved_blocks``; OpenMP threads sleep
between calls); the table has the median of the rounds, the
achieved GFLOP/s, and its share of the bf16 matrix peak measured in the same rounds
(``torch.mm`` 4096 x 4096 in bf16). Our bf16 runs twice: on AMX, and built for the same CPU without
AMX (the AVX512-BF16 kernels). Usage::

    python benchmarks/bench_precision.py [--rounds 5] [--threads N]
"""

from __future__ import annotations

import _omp_passive  # noqa: F401  # isort: skip  (first: before torch loads its OpenMP)

import argparse
import copy

import torch
import torchvision
import tvm
from _common import interleaved_blocks
from tvm import relax

from tvm_roialign.frontend import from_exported_program
from tvm_roialign.host import request_amx, use_usable_cores
from tvm_roialign.pipeline import build
from tvm_roialign.target import describe, parse_target

#: this machine's CPU name with AVX512-BF16 and without AMX: the kernels a Cooper Lake or Zen 4 gets
AVX512_BF16 = parse_target("llvm -mcpu=rocketlake -mattr=+avx512bf16")


class BoxHeadFC6(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc6 = torch.nn.Linear(12544, 1024)

    def forward(self, x):
        return torch.relu(self.fc6(x))


def _resnet50():
    torch.manual_seed(0)
    model = torchvision.models.resnet50().train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, 224, 224))
    return model.eval()


def _flops(model, x) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    return float(counter.get_total_flops())


def _tvm_runner(model, x, target, precision):
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=False)
    vm = relax.VirtualMachine(build(mod, target, precision=precision).executable, tvm.cpu())
    data = tvm.runtime.tensor(x.numpy())
    return lambda: vm["main"](data)


def _openvino_runner(model, x):
    import openvino

    compiled = openvino.compile_model(openvino.convert_model(model, example_input=(x,)), "CPU")
    request = compiled.create_infer_request()
    data = x.numpy()
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    return (lambda: request.infer([data])), getattr(hint, "get_type_name", lambda: str(hint))()


def _torch_bf16_runner(model, x):
    model16, x16 = copy.deepcopy(model).to(torch.bfloat16), x.to(torch.bfloat16)

    def run():
        with torch.no_grad():
            model16(x16)

    return run


def _runners(model, x, target):
    runners = {
        "tvm-roialign fp32": _tvm_runner(model, x, target, "fp32"),
        "tvm-roialign bf16 (AMX)": _tvm_runner(model, x, target, "bf16"),
        "tvm-roialign bf16 (AVX512-BF16, AMX off)": _tvm_runner(model, x, AVX512_BF16, "bf16"),
    }
    run, hint = _openvino_runner(model, x)
    runners[f"OpenVINO default ({hint})"] = run
    runners["PyTorch bf16"] = _torch_bf16_runner(model, x)
    return runners


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of every runtime (default: the cores this process may use)")
    args = parser.parse_args()
    # TVM's pool sized before its first kernel: left alone, TVM 0.27 takes half the x86 cores
    # (it assumes two hyperthreads a core), one thread of two vCPUs
    args.threads = use_usable_cores(args.threads)
    torch.set_num_threads(args.threads)
    request_amx(required=True)
    target = parse_target("native")
    a = torch.randn(4096, 4096).to(torch.bfloat16)
    workloads = {
        "fc6 1000x12544x1024": (BoxHeadFC6().eval(), torch.randn(1000, 12544)),
        "resnet50 1x3x224x224": (_resnet50(), torch.randn(1, 3, 224, 224)),
    }
    cpu = next(line for line in open("/proc/cpuinfo") if line.startswith("model name"))
    print(f"{cpu.split(':', 1)[1].strip()}; target {describe(target)}; {args.threads} threads")
    for title, (model, x) in workloads.items():
        flops = _flops(model, x)
        runners = {"peak: torch.mm 4096 bf16": lambda: a @ a, **_runners(model, x, target)}
        medians = interleaved_blocks(runners, args.rounds)
        peak = 2 * 4096**3 / medians["peak: torch.mm 4096 bf16"] / 1e9
        print(f"\n{title} ({flops / 1e9:.1f} GFLOP), median of {args.rounds} interleaved rounds")
        print(f"| runner | ms | GFLOP/s | of bf16 peak ({peak:.0f} GFLOP/s) |\n|---|---|---|---|")
        for name, seconds in medians.items():
            if name.startswith("peak"):
                continue
            rate = flops / seconds / 1e9
            print(f"| {name} | {seconds * 1e3:.1f} | {rate:.0f} | {rate / peak:.0%} |")


if __name__ == "__main__":
    main()
