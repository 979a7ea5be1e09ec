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

#: The library function that computes the weights a library does not store (the Winograd-transformed
#: ones, :class:`tvm_roialign.passes.LiftWeightTransforms`); every other public function of such a
#: library takes its results after its own arguments (:class:`tvm_roialign.runtime.LoadedVM`).
LOAD_WEIGHTS = "load_weights"

#: The parameters of a public function for :data:`LOAD_WEIGHTS`'s results: ``winograd_weight0``...
WEIGHT_PARAM = "winograd_weight"
