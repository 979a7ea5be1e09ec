"""The targets the tests build for, named once: a portable generic llvm (what TVM's plain ``llvm``
means), this machine's CPU, a generic AArch64 (cross), a CUDA GPU (built, run only with one), and
the command line's ``native`` and ``aarch64`` (:func:`tvm_roialign.target.parse_target`)."""

import tvm

from tvm_roialign.target import parse_target

#: Generic llvm for this machine's architecture (baseline ISA): what most op tests build for.
GENERIC = tvm.target.Target({"kind": "llvm"})
#: This machine's CPU (LLVM's name for it), without a core count.
NATIVE = tvm.target.Target(
    {"kind": "llvm", "mcpu": str(tvm.target.codegen.llvm_get_system_cpu())}
)
#: A generic AArch64 (a cross target here).
AARCH64 = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})
#: An Ampere-class CUDA GPU with an llvm host.
CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host={"kind": "llvm"})
#: The command line's ``native``: this machine's CPU with its usable core count.
CLI_NATIVE = parse_target("native")
#: The command line's ``aarch64``: a generic AArch64 with its features spelled out.
CLI_AARCH64 = parse_target("aarch64")
