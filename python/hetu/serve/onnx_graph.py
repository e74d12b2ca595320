"""The dense part of a trained graph as an ONNX model: the walk from the prediction back to the
embedding lookups, which become the model's inputs (each lookup's rows, per field: [batch,
fields, width], pooled per bag for a bag lookup), the dense features' placeholder another input,
each parameter an initializer holding its trained value, and every other op mapped by its own
``to_onnx(b, x)`` (hetu.ops, beside the op) through the ONNXBuilder ``b`` below."""
import numpy as np

from ..graph import Variable, topo_sort
from ..ops.embedding import EmbeddingLookupOp

OPSET = 17
PROBABILITY = "probability"


class ExportError(ValueError):
    """A graph that cannot be exported (an op without an ONNX mapping, an input it cannot take)."""


class ONNXBuilder:
    """Collects nodes and initializers; what an op's to_onnx calls."""

    def __init__(self, shapes, persistent):
        self.nodes, self.initializers = [], []
        self._shapes, self._persistent = shapes, persistent
        self._names = 0

    def _fresh(self, hint):
        self._names += 1
        return f"{hint}:{self._names}"   # ":" keeps them apart from parameter names

    def node(self, op_type, inputs, **attrs):
        """Adds one node of `op_type` over the named `inputs`; returns its output's name."""
        from onnx import helper
        out = self._fresh(op_type)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value, name=None):
        """An initializer holding `value` (float32 stays float32, int64 int64); returns its name."""
        from onnx import numpy_helper
        name = name or self._fresh("const")
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def shape_of(self, node):
        """The static shape of a graph node (batch dimension 1)."""
        return self._shapes[node.id]

    def persistent(self, key):
        """A running statistic of the checkpoint (persistent/KEY), e.g. batch norm's."""
        if key not in self._persistent:
            raise ExportError(f"the checkpoint has no running statistic {key}")
        return np.asarray(self._persistent[key], np.float32)


def lookups_of(prediction):
    """The embedding lookups the prediction reads, in graph order."""
    return [n for n in topo_sort([prediction]) if isinstance(n, EmbeddingLookupOp)]


def walk(prediction, cut):
    """The nodes `prediction` depends on, inputs first, not walking past the nodes of `cut` (ids)."""
    needed, todo = set(), [prediction]
    while todo:
        n = todo.pop()
        if n.id not in needed:
            needed.add(n.id)
            if n.id not in cut:
                todo.extend(n.inputs)
    return [n for n in topo_sort([prediction]) if n.id in needed]


def build(prediction, dense, values, persistent, lookup_names, dense_width, slots):
    """(onnx ModelProto) of `prediction`'s forward: `dense` the dense features' placeholder (None:
    there are none, `dense_width` their width), `values` each parameter's trained value by name,
    `persistent` the running statistics, `lookup_names` the input name of each lookup (lookups_of
    order), whose ids are [batch, `slots`]. A parameter is an initializer; an op without to_onnx,
    or ids read other than through a lookup, is an ExportError naming it."""
    inputs = {op.id: (name, np.float32, None) for op, name in zip(lookups_of(prediction), lookup_names)}
    if dense is not None:
        inputs[dense.id] = ("dense", np.float32, (dense_width,))
    # The probability as [batch] (the graph's is [batch, 1]).
    return to_model(prediction, PROBABILITY, inputs, values, persistent, slots, flatten=True)


def to_model(output, output_name, inputs, values, persistent, slots, flatten=False):
    """(onnx ModelProto) of `output`'s forward, named `output_name`: `inputs` {node id: (input
    name, numpy dtype, shape without the batch, None for an embedding lookup's rows over ids of
    [batch, `slots`])}, the nodes the model takes instead of computing (the walk stops there);
    with `flatten` the output reshaped to [batch]. Everything else as build says."""
    import onnx
    from onnx import helper
    order = walk(output, set(inputs))
    shapes = {}
    for n in order:   # static shapes for a batch of one
        if n.id in inputs:
            tail = inputs[n.id][2]
            shapes[n.id] = tuple(n.infer_shape([tuple(n.inputs[0].shape), (1, slots)])) if tail is None \
                else (1, *tail)
        elif isinstance(n, Variable) and n.is_placeholder:
            raise ExportError(f"the graph reads {n.name} other than through an embedding lookup, which the "
                              f"exported dense part cannot")
        elif isinstance(n, Variable):
            shapes[n.id] = tuple(n.shape)
        else:
            shapes[n.id] = tuple(n.infer_shape([shapes[x.id] for x in n.inputs]))
    names = {}
    b = ONNXBuilder(shapes, persistent)
    graph_inputs = []
    for n in order:
        if n.id in inputs:
            name, dtype = inputs[n.id][:2]
            names[n.id] = name
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                                              ["batch", *shapes[n.id][1:]]))
        elif isinstance(n, Variable):
            if n.name not in values:
                raise ExportError(f"parameter {n.name}: the checkpoint holds no value for it")
            names[n.id] = b.const(np.asarray(values[n.name], np.float32).reshape(n.shape), name=n.name)
        else:
            mapping = getattr(n, "to_onnx", None)
            if mapping is None:
                raise ExportError(f"op {type(n).__name__} ({n.name}) has no ONNX mapping: it cannot be exported")
            names[n.id] = mapping(b, [names[x.id] for x in n.inputs])
    out = names[output.id]
    if flatten:
        out = b.node("Reshape", [out, b.const(np.array([-1], np.int64))])
    b.nodes.append(helper.make_node("Identity", [out], [output_name], name=output_name))
    out_shape = ["batch"] if flatten else ["batch", *shapes[output.id][1:]]
    graph = helper.make_graph(b.nodes, "hetu_dense", graph_inputs,
                              [helper.make_tensor_value_info(output_name, onnx.TensorProto.FLOAT, out_shape)],
                              initializer=b.initializers)
    model = helper.make_model(graph, producer_name="hetu", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8   # onnxruntime of several versions reads IR 8 (opset 17)
    onnx.checker.check_model(model, full_check=True)
    return model
