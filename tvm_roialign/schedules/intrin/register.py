"""Registration of the contraction's 32 x 32 block micro-kernels (AMX tiles, AVX-512 BF16 / VNNI,
AArch64 BFDOT / dot products): each kernel over ``kc`` reduction elements, with or without its init,
has one name and is registered with ``TensorIntrin`` on first use."""

from __future__ import annotations

from collections.abc import Callable

from tvm.s_tir import TensorIntrin

_REGISTERED: set[str] = set()


def register_block_intrin(
    prefix: str, step: int, kc: int, zero_init: bool, desc: Callable, impl: Callable
) -> str:
    """The name ``{prefix}_32x32x{kc}[_init]`` of the kernel ``impl(kc, zero_init)`` tensorizing
    ``desc(kc, zero_init)``, registered on first use; ``kc`` must be a positive multiple of
    ``step``. ``zero_init``: the block's whole reduction (the accumulators start at zero instead
    of a load of the output)."""
    if kc <= 0 or kc % step:
        raise ValueError(f"kc must be a positive multiple of {step}, got {kc}")
    name = f"{prefix}_32x32x{kc}" + ("_init" if zero_init else "")
    if name not in _REGISTERED:
        TensorIntrin.register(name, desc(kc, zero_init), impl(kc, zero_init), override=True)
        _REGISTERED.add(name)
    return name


__all__ = ["register_block_intrin"]
