"""ONNX graph fixes before TVM's importer: what it cannot read, rewritten to what it can, the
model's meaning unchanged.

* An empty ``axes`` attribute of a ``Reduce*`` node (``torch.amax(x)`` exports one): TVM cannot
  parse an empty list attribute; an absent ``axes`` means the same (every axis).
* An input that TVM's converter needs as a constant (``TopK``'s ``k``: ``torch.sort`` exports it as
  ``Gather(Shape(x))``) computed from static shapes (``Shape`` of a tensor whose shape is known, then
  ``Gather``/``Slice``/``Concat``/arithmetic, evaluated by ONNX's reference evaluator): given to
  that node as a constant; the computation stays for its other consumers.
"""

from __future__ import annotations

import numpy as np

#: folded values larger than this stay computed (shape-like values are a handful of integers)
MAX_FOLDED = 64
_INT_TYPES = (6, 7)  # onnx.TensorProto.INT32, INT64
#: op type -> the inputs TVM's converter needs as constants
NEEDS_CONSTANT = {"TopK": (1,)}


def _static_shapes(model, shape_dict) -> dict:
    """Name -> static shape of every value whose shape ONNX's shape inference knows, with the
    inputs' shapes taken from ``shape_dict`` where it gives them."""
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in model.graph.input:
        dims = (shape_dict or {}).get(value.name)
        if dims is not None and all(isinstance(d, int) for d in dims):
            shape = value.type.tensor_type.shape
            del shape.dim[:]
            for d in dims:
                shape.dim.add().dim_value = d
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError):  # nothing is folded
        return {}
    shapes = {}
    graph = inferred.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[value.name] = [d.dim_value for d in tensor.shape.dim]
    return shapes


def _drop_empty_reduce_axes(graph) -> None:
    for node in graph.node:
        if node.op_type.startswith("Reduce"):
            for attr in list(node.attribute):
                if attr.name == "axes" and attr.type == attr.INTS and len(attr.ints) == 0:
                    node.attribute.remove(attr)


def _shape_value(node, shapes) -> np.ndarray | None:
    shape = shapes.get(node.input[0])
    if shape is None:
        return None
    attrs = {a.name: a.i for a in node.attribute}
    return np.array(shape[attrs.get("start", 0):attrs.get("end", len(shape))], np.int64)


def _evaluate(node, values: list) -> list | None:
    """The outputs of ``node`` on constant ``values``, by ONNX's reference evaluator."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" for i in range(len(values))]
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in zip(names, values)]
    outputs = [helper.make_tensor_value_info(f"out{i}", onnx.TensorProto.UNDEFINED, None)
               for i in range(len(node.output))]
    copy = helper.make_node(node.op_type, names, [o.name for o in outputs], domain=node.domain)
    copy.attribute.extend(node.attribute)
    graph = helper.make_graph([copy], "fold", inputs, outputs)
    try:
        evaluator = ReferenceEvaluator(helper.make_model(graph))
        return evaluator.run(None, dict(zip(names, values)))
    except (NotImplementedError, RuntimeError, TypeError, ValueError, KeyError, IndexError):
        # an op or attribute the reference evaluator does not take: left to TVM
        return None


def _known_values(graph, shapes) -> dict:
    """Name -> value of every small integer tensor computable before the model runs: initializers,
    ``Constant`` nodes, ``Shape`` of a statically shaped tensor, and ops on those."""
    from onnx import numpy_helper

    known = {t.name: numpy_helper.to_array(t) for t in graph.initializer
             if t.data_type in _INT_TYPES and np.prod(t.dims) <= MAX_FOLDED}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Constant":
            value = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), None)
            outputs = [value]
        elif node.op_type == "Shape":
            outputs = [_shape_value(node, shapes)]
        elif node.input and all(name in known for name in node.input if name):
            outputs = _evaluate(node, [known[name] for name in node.input if name])
        else:
            continue
        for name, value in zip(node.output, outputs or ()):
            if value is not None and np.asarray(value).dtype.kind in "iu" and np.size(value) <= MAX_FOLDED:
                known[name] = np.asarray(value)
    return known


def _fold_static_shapes(model, shape_dict) -> None:
    """The inputs of :data:`NEEDS_CONSTANT` computed from static shapes, given as constants."""
    from onnx import helper, numpy_helper

    graph = model.graph
    wanted = [(node, i) for node in graph.node for i in NEEDS_CONSTANT.get(node.op_type, ())
              if len(node.input) > i and node.input[i]]
    if not wanted:
        return
    direct = {t.name for t in graph.initializer}
    direct |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    if all(node.input[i] in direct for node, i in wanted):
        return
    known = _known_values(graph, _static_shapes(model, shape_dict))
    for node, i in wanted:
        name = node.input[i]
        if name in direct or name not in known:
            continue
        folded = f"{name}_static"
        constant = helper.make_node("Constant", [], [folded], value=numpy_helper.from_array(known[name]))
        graph.node.insert(list(graph.node).index(node), constant)
        node.input[i] = folded


def readable_by_tvm(model, shape_dict=None):
    """The ONNX ``model`` with the rewrites above: a copy where one applies (the caller's model is
    not changed), ``model`` itself otherwise."""
    import onnx

    graph = model.graph
    empty_axes = any(a.name == "axes" and a.type == a.INTS and len(a.ints) == 0
                     for n in graph.node if n.op_type.startswith("Reduce") for a in n.attribute)
    if not empty_axes and not any(n.op_type in NEEDS_CONSTANT for n in graph.node):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    _drop_empty_reduce_axes(model.graph)
    _fold_static_shapes(model, shape_dict)
    return model
