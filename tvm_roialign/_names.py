"""The package's public names, for its ``__init__`` (which loads them on first use in the command
line's process) and :mod:`tvm_roialign._api` (which defines them)."""

PUBLIC_NAMES = [
    "__version__",
    "frontend",
    "is_registered",
    "multiscale_roi_align",
    "passes",
    "ps_roi_align",
    "quantized_roi_align",
    "register",
    "roi_align",
    "roi_align_rotated",
    "stock_tvm",
    "strategies",
    "topi",
    "unregister",
]
