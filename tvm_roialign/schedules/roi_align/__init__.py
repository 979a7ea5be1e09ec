"""RoIAlign's schedule rules: the CPU rule (:mod:`.cpu`), the GPU rule (:mod:`.gpu`), what they
share (:mod:`~tvm_roialign.schedules.base`) and the hand-scheduled adaptive-grid CPU kernel (:mod:`.kernel`
and its parts); applied by :mod:`tvm_roialign.strategies` when an op is legalized."""
