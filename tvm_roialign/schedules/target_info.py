"""What the CPU schedule rules need to know about an llvm target: vector width, registers, cores, caches.

Everything is derived from the target, never from the machine the compiler runs on, except where the
target *is* this machine (no ``mtriple``, or this machine's triple, and no explicit attribute): then the
core count and cache sizes come from the operating system, as TVM's own runtime would see them.

* vector width: from the CPU features LLVM reports for the target's ``mcpu``/``mattr``
  (``llvm_get_vector_width`` reports 512 bits for every x86 target in TVM 0.27, even baseline x86-64,
  so it is not used): AVX-512 -> 512 bits and 32 registers, AVX/AVX2 -> 256 bits and 16, SSE -> 128
  and 16; AArch64 NEON -> 128 bits and 32 registers (SVE is scheduled as 128-bit NEON);
* ``has_fma``: whether a multiply-add is one instruction (AVX2/FMA, AArch64);
* cores: the target's ``num-cores``, else this machine's (for a cross target: 4);
* caches: L1d and L2 per core from ``/sys`` for the host, else 32 KiB and 1 MiB;
* matrix and dot-product units from the same features: ``has_amx_bf16``, ``has_amx_int8``,
  ``has_avx512_bf16``, ``has_vnni`` (x86), ``has_bf16``, ``has_dotprod``, ``has_i8mm`` (AArch64).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import tvm

from ..host import is_host_triple, usable_cores

_DEFAULT_L1 = 32 * 1024
_DEFAULT_L2 = 1024 * 1024
_DEFAULT_CROSS_CORES = 4


@dataclass(frozen=True)
class CPUInfo:
    """Sizes a CPU schedule is derived from."""

    vector_bits: int
    vector_registers: int
    has_fma: bool
    num_cores: int
    l1_bytes: int
    l2_bytes: int
    arch: str
    #: the LLVM CPU features of the target (its ``mcpu`` and ``mattr``)
    features: frozenset = frozenset()

    @property
    def has_amx_bf16(self) -> bool:
        """AMX tiles with the bf16 dot product (``tdpbf16ps``)."""
        return self.arch == "x86" and {"amx-tile", "amx-bf16"} <= self.features

    @property
    def has_amx_int8(self) -> bool:
        """AMX tiles with the int8 dot products (``tdpbusd`` ...)."""
        return self.arch == "x86" and {"amx-tile", "amx-int8"} <= self.features

    @property
    def has_avx512_bf16(self) -> bool:
        """The 512-bit bf16 pair dot product ``vdpbf16ps``."""
        return self.arch == "x86" and {"avx512f", "avx512bf16"} <= self.features

    @property
    def has_vnni(self) -> bool:
        """The u8 x s8 dot product ``vpdpbusd`` (AVX512-VNNI or AVX-VNNI)."""
        return self.arch == "x86" and bool({"avx512vnni", "avxvnni"} & self.features)

    @property
    def has_bf16(self) -> bool:
        """AArch64 bf16 (``bfmmla``, ``bfdot``)."""
        return self.arch == "aarch64" and "bf16" in self.features

    @property
    def has_dotprod(self) -> bool:
        """AArch64 int8 dot product (``sdot``, ``udot``)."""
        return self.arch == "aarch64" and "dotprod" in self.features

    @property
    def has_i8mm(self) -> bool:
        """AArch64 int8 matrix multiply (``smmla``)."""
        return self.arch == "aarch64" and "i8mm" in self.features

    def lanes(self, dtype: str = "float32") -> int:
        """Elements of ``dtype`` per vector register."""
        bits = tvm.runtime.DataType(dtype).bits
        return max(self.vector_bits // bits, 1)


def _features(target: tvm.target.Target) -> set[str]:
    from tvm.target import codegen

    try:
        return {str(f) for f in codegen.llvm_get_cpu_features(target)}
    except Exception:  # noqa: BLE001 - an llvm without this query: assume the baseline
        return set()


def _triple(target: tvm.target.Target) -> str:
    triple = str(target.attrs.get("mtriple", "") or "")
    if not triple:
        from tvm.target import codegen

        triple = str(codegen.llvm_get_system_triple())
    return triple


def _is_host(target: tvm.target.Target) -> bool:
    return is_host_triple(target.attrs.get("mtriple", ""))


@functools.cache
def _host_cache_bytes(level: int) -> int | None:
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            path = os.path.join(base, entry)
            with open(os.path.join(path, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(path, "type")) as f:
                if f.read().strip() not in ("Data", "Unified"):
                    continue
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
            return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return None
    return None


#: The target attributes a :class:`CPUInfo` depends on (the CPU features LLVM reports depend on
#: the first four).
_RELEVANT_ATTRS = ("mtriple", "mcpu", "mattr", "mabi", "num-cores")


class _ByFields:
    """A target compared and hashed by :data:`_RELEVANT_ATTRS` only: the key of :func:`cpu_info`'s
    bounded cache (two targets that differ elsewhere, in ``keys`` or a tag, share an entry)."""

    def __init__(self, target: tvm.target.Target):
        self.target = target
        attrs = target.attrs
        self.key = (
            str(target.kind.name),
            *(
                tuple(str(a) for a in attrs.get(name) or ()) if name == "mattr"
                else str(attrs.get(name, "") or "")
                for name in _RELEVANT_ATTRS
            ),
        )

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other) -> bool:
        return isinstance(other, _ByFields) and self.key == other.key


def cpu_info(target: tvm.target.Target) -> CPUInfo:
    """:class:`CPUInfo` of an llvm ``target`` (see the module docstring)."""
    return _cpu_info_by_fields(_ByFields(target))


@functools.lru_cache(maxsize=32)
def _cpu_info_by_fields(target: _ByFields) -> CPUInfo:
    return _cpu_info(target.target)


def _cpu_info(target: tvm.target.Target) -> CPUInfo:
    triple = _triple(target)
    feats = _features(target)
    if triple.startswith(("aarch64", "arm64")):
        arch, bits, regs, fma = "aarch64", 128, 32, True
    elif triple.startswith(("x86_64", "i686", "i386")):
        arch = "x86"
        if "avx512f" in feats:
            bits, regs = 512, 32
        elif "avx" in feats or "avx2" in feats:
            bits, regs = 256, 16
        else:
            bits, regs = 128, 16
        fma = "fma" in feats or "avx512f" in feats
    else:
        arch, bits, regs, fma = triple.split("-")[0] or "unknown", 128, 16, False
    host = _is_host(target)
    cores = target.attrs.get("num-cores")
    if cores is not None and int(cores) > 0:
        cores = int(cores)
    elif host:
        cores = usable_cores()
    else:
        cores = _DEFAULT_CROSS_CORES
    l1 = (_host_cache_bytes(1) if host else None) or _DEFAULT_L1
    l2 = (_host_cache_bytes(2) if host else None) or _DEFAULT_L2
    return CPUInfo(bits, regs, fma, max(int(cores or 1), 1), l1, l2, arch, frozenset(feats))


__all__ = ["CPUInfo", "cpu_info"]
