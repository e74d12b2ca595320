"""Static shape inference: every node whose input shapes are known at compile time (parameters,
dataloaders, placeholders given a shape) gets its shape checked now, so a mismatch is reported
before the first step, naming the ops and shapes."""
from ..graph import Variable


def check_shapes(graph):
    graph.shapes = {}
    for name, order in graph.topo.items():
        shapes = {}
        for node in order:
            if isinstance(node, Variable):
                shape = node.shape
            elif hasattr(node, "shape_for"):
                shape = node.shape_for(name)
            else:
                ins = [shapes.get(x.id) for x in node.inputs]
                shape = node.infer_shape(ins) if ins and all(s is not None for s in ins) else None
            shapes[node.id] = None if shape is None else tuple(shape)
        graph.shapes[name] = shapes
    return graph
