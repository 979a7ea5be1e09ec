"""The reduced-precision contraction rules: bf16 (:mod:`.bf16`) and int8 (:mod:`.int8`) GEMMs on
the 32 x 32 block micro-kernels of :mod:`tvm_roialign.schedules.intrin`."""
