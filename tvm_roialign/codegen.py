"""A Relax module's kernels compiled in parallel: ``tvm.compile`` for a CPU target, with its TIR
lowering and LLVM code generation split over the cores this process may use.

``tvm.compile`` lowers every PrimFunc of a module and generates their code in one thread: for Mask
R-CNN, 27 of its 38 s of build on a 2-core Zen 4 (15 s of TIR passes, 12 s of LLVM). The PrimFuncs
are independent (a kernel calls no other kernel), so :func:`compile_parallel` hands each of
``jobs`` threads a share of them, balanced by their size, and each builds its share with
``tvm.tirx.build`` into an LLVM module of its own (TVM's FFI calls release the GIL, so the threads
run at once). The first module imports the others and the Relax VM is linked on it as
``tvm.compile`` links it; :func:`tvm_roialign.linking.export_library` writes each module's object
(in threads too) and links them into one library, where every kernel is a symbol of the same shared
object, as in a library built in one piece.

Each thread runs in the caller's ``PassContext`` (its options and instruments: TVM's current
context is per thread) and target. Where a kernel refers to another function of the module, the
target is not a CPU one, or the library is a system library (wasm), the build is ``tvm.compile``'s
own.
"""

from __future__ import annotations

import concurrent.futures
import heapq

import tvm
import tvm_ffi
from tvm import relax, tirx

from .host import usable_cores


def _kernel_sizes(tir_mod: tvm.IRModule) -> dict | None:
    """Each PrimFunc's size (its statements: what the TIR passes and LLVM walk, roughly),
    or None where a PrimFunc refers to another function of the module (a subroutine call: the two
    must be built together)."""
    sizes = {}
    names = {gvar.name_hint for gvar in tir_mod.get_global_vars()}
    for gvar, func in tir_mod.functions.items():
        count = [0]
        calls = []
        tvm_ffi.structural_walk(func.body, [
            (tirx.Stmt, lambda _node, count=count: count.__setitem__(0, count[0] + 1)),
            (tvm.ir.GlobalVar, lambda node, calls=calls: calls.append(node.name_hint in names)),
        ])
        if any(calls):
            return None
        sizes[gvar] = count[0]
    return sizes


def _shares(sizes: dict, jobs: int) -> list[list]:
    """``sizes``' keys in ``jobs`` lists of near-equal total size (largest first, each to the
    lightest list)."""
    heap = [(0, i) for i in range(jobs)]
    shares: list[list] = [[] for _ in range(jobs)]
    for key in sorted(sizes, key=lambda k: (-sizes[k], k.name_hint)):
        total, i = heapq.heappop(heap)
        shares[i].append(key)
        heapq.heappush(heap, (total + sizes[key], i))
    return [share for share in shares if share]


def build_kernels(tir_mod: tvm.IRModule, target: tvm.target.Target, jobs: int,
                  pipeline="default") -> tvm.runtime.Module:
    """``tvm.tirx.build(tir_mod, target)`` in up to ``jobs`` threads: one LLVM module per share of the
    PrimFuncs, the first importing the rest."""
    sizes = _kernel_sizes(tir_mod) if jobs > 1 else None
    shares = _shares(sizes, jobs) if sizes else []
    if len(shares) < 2:
        return tirx.build(tir_mod, target=target, pipeline=pipeline)
    ctx = tvm.transform.PassContext.current()

    def build(share):
        part = tvm.IRModule({gvar: tir_mod[gvar] for gvar in share}, attrs=tir_mod.attrs)
        with ctx, target:
            return tirx.build(part, target=target, pipeline=pipeline)

    with concurrent.futures.ThreadPoolExecutor(len(shares)) as pool:
        libs = list(pool.map(build, shares))
    for lib in libs[1:]:
        libs[0].import_module(lib)
    return libs[0]


def compile_parallel(mod: tvm.IRModule, target: tvm.target.Target, relax_pipeline,
                     jobs: int | None = None):
    """``tvm.compile(mod, target, relax_pipeline=relax_pipeline)`` with the kernels built by
    :func:`build_kernels` in ``jobs`` threads (None: as many as this process has cores); a
    ``relax.VMExecutable``."""
    from tvm.relax import _ffi_api, vm_build

    if jobs is None:
        jobs = usable_cores()

    system_lib = "wasm" in str(target.attrs.get("mtriple", "")) or (
        mod.attrs is not None and "system_lib_prefix" in mod.attrs
    )
    if jobs < 2 or target.kind.name != "llvm" or system_lib:
        # a system library registers its kernels from one module
        return tvm.compile(mod, target=target, relax_pipeline=relax_pipeline)
    with target:
        mod = relax_pipeline(mod)
    attrs = dict(mod.attrs) if mod.attrs else {}
    ext_libs = list(attrs.get("external_mods", []))
    params = dict(attrs.get("const_name_to_constant", {}))
    builder = relax.ExecBuilder()
    mod = vm_build._vmcodegen(builder, mod, "bytecode")
    kernels = {gvar: func for gvar, func in mod.functions.items() if isinstance(func, tirx.PrimFunc)}
    lib = None
    if kernels:
        lib = build_kernels(tvm.IRModule(kernels, attrs=mod.attrs), target, jobs)
    lib = _ffi_api.VMLink(builder, target, lib, ext_libs, params)
    return relax.VMExecutable(lib)


__all__ = ["build_kernels", "compile_parallel"]
