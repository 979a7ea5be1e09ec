"""The targets the tests build for, named once: a portable generic llvm (what TVM's plain ``llvm``
means), this machine's CPU, and a generic AArch64 (cross)."""

import tvm

#: Generic llvm for this machine's architecture (baseline ISA): what most op tests build for.
GENERIC = tvm.target.Target({"kind": "llvm"})
#: This machine's CPU, with its core count (what the CLI's ``native`` is).
NATIVE = tvm.target.Target(
    {"kind": "llvm", "mcpu": str(tvm.target.codegen.llvm_get_system_cpu())}
)
#: A generic AArch64 (a cross target here).
AARCH64 = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})
