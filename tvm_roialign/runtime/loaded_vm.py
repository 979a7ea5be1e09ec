"""A Relax VM of a library whose Winograd-transformed weights are computed when it is loaded.

A library built with ``weights_at_load`` (the CLI's ``compile`` and every detector artifact) stores
the 3x3 weights only; its function :data:`~tvm_roialign._names.LOAD_WEIGHTS` computes the
transformed ones, and every other public function takes them after its own arguments
(:class:`tvm_roialign.passes.LiftWeightTransforms`). :class:`LoadedVM` calls it once, when it is
made, and passes its results on: ``vm["detect"](x)``, ``set_input``, ``time_evaluator`` and
``save_function`` take the function's own arguments, as on any library (``time_evaluator(
"invoke_stateful", dev)("detect")`` after ``set_input`` as well). A library without that
function runs as under ``relax.VirtualMachine``.
"""

from __future__ import annotations

from tvm import relax

from .._names import LOAD_WEIGHTS, WEIGHT_PARAM


class LoadedVM(relax.VirtualMachine):
    """``relax.VirtualMachine`` that runs the library's :data:`LOAD_WEIGHTS` once (on the VM's
    device, local or remote) and appends its results to every other function's arguments."""

    def __init__(self, rt_mod, device, memory_cfg=None):
        super().__init__(rt_mod, device, memory_cfg)
        self.weights: tuple = ()
        self._takes: dict[str, bool] = {}
        if self.module.implements_function(LOAD_WEIGHTS):
            # through the stateful interface, which also returns a remote VM's tensors
            super().set_input(LOAD_WEIGHTS)
            self.invoke_stateful(LOAD_WEIGHTS)
            self.weights = tuple(self.get_outputs(LOAD_WEIGHTS))
        #: the name of a taking function's last parameter (LiftWeightTransforms names them so)
        self._last_name = f"{WEIGHT_PARAM}{len(self.weights) - 1}"

    def _bound(self, func_name: str) -> tuple:
        """The weights ``func_name`` takes after its own arguments: those of :data:`LOAD_WEIGHTS`
        for a function of the library whose last parameters are they, else none (the VM's own
        functions, ``invoke_stateful``, a ``save_function`` closure, ``load_weights`` itself)."""
        if not self.weights or func_name == LOAD_WEIGHTS:
            return ()
        if func_name not in self._takes:
            try:
                arity = int(self._get_function_arity(func_name))
                last = str(self._get_function_param_name(func_name, arity - 1))
            except Exception:  # noqa: BLE001 - not a function of the library
                arity, last = 0, ""
            self._takes[func_name] = arity >= len(self.weights) and last == self._last_name
        return self.weights if self._takes[func_name] else ()

    def __getitem__(self, key: str):
        func = super().__getitem__(key)
        weights = self._bound(key)
        if not weights:
            return func
        return lambda *args: func(*args, *weights)

    def set_input(self, func_name: str, *args, **kwargs) -> None:
        super().set_input(func_name, *args, *self._bound(func_name), **kwargs)

    def save_function(self, func_name: str, saved_name: str, *args, include_return: bool = True, **kwargs):
        super().save_function(
            func_name, saved_name, *args, *self._bound(func_name), include_return=include_return, **kwargs
        )

    def time_evaluator(self, func_name: str, dev, *args, **kwargs):
        evaluator = super().time_evaluator(func_name, dev, *args, **kwargs)
        weights = self._bound(func_name)
        if not weights:
            return evaluator
        return lambda *inputs: evaluator(*inputs, *weights)


__all__ = ["LoadedVM"]
