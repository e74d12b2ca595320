"""Graph nodes: the Op base class, Variables (parameters and placeholders), traversal.

An op has inputs, an optional device context, `infer_shape`, `compute` (one kernel that works
on NumPy or CuPy arrays, whichever the executor gives it) and `gradient`, which builds more graph.
"""
import itertools

import numpy as np


class Op:
    _next_id = itertools.count()
    # Set by ops whose compute has side effects (optimizer steps, PS pushes): never pruned.
    has_side_effect = False
    # On a GPU: False for ops whose compute waits for the device, reads host data or changes
    # shape from step to step, which a CUDA graph cannot hold (hetu.device_step).
    capturable = True
    # True for ops that read their (id) inputs on the host: on a GPU they get the host copy of
    # the step's dataloader batches and fed values.
    host_inputs = False

    def __init__(self, *inputs, ctx=None, name=None):
        for i, x in enumerate(inputs):
            if not isinstance(x, Op):
                raise TypeError(f"{type(self).__name__}: input {i} is {type(x).__name__}, not a graph node")
        self.inputs = list(inputs)
        self.ctx = ctx
        self.id = next(Op._next_id)
        self.name = name or f"{type(self).__name__.removesuffix('Op')}_{self.id}"

    # --- to be provided by each op -------------------------------------------------------
    def infer_shape(self, input_shapes):
        raise NotImplementedError(type(self).__name__)

    def infer_dtype(self, input_dtypes):
        return np.float32

    def compute(self, vals, state):
        """vals: the input values (arrays); state: the executor's RunState."""
        raise NotImplementedError(type(self).__name__)

    def gradient(self, output_grad):
        """Nodes computing d(loss)/d(input) for each input (None where there is none)."""
        raise NotImplementedError(f"{type(self).__name__} has no gradient")

    # --- operator overloads ---------------------------------------------------------------
    def __add__(self, other):
        from .ops import math as m
        return m.add_op(self, other) if isinstance(other, Op) else m.addbyconst_op(self, other)

    __radd__ = __add__

    def __sub__(self, other):
        from .ops import math as m
        return m.minus_op(self, other) if isinstance(other, Op) else m.addbyconst_op(self, -other)

    def __rsub__(self, other):
        from .ops import math as m
        return m.addbyconst_op(m.opposite_op(self), other)

    def __mul__(self, other):
        from .ops import math as m
        return m.mul_op(self, other) if isinstance(other, Op) else m.mul_byconst_op(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        from .ops import math as m
        return m.div_op(self, other) if isinstance(other, Op) else m.mul_byconst_op(self, 1.0 / other)

    def __rtruediv__(self, other):
        from .ops import math as m
        return m.div_const_op(other, self)

    def __neg__(self):
        from .ops import math as m
        return m.opposite_op(self)

    def __matmul__(self, other):
        from .ops import math as m
        return m.matmul_op(self, other)

    def __repr__(self):
        args = ", ".join(x.name for x in self.inputs)
        return f"{self.name} = {type(self).__name__}({args})"


class Variable(Op):
    """A trainable (or frozen) parameter when it has a value or an initializer, else a placeholder
    that the caller feeds through `feed_dict`."""

    def __init__(self, name, value=None, initializer=None, trainable=True, dtype=np.float32, ctx=None, shape=None):
        super().__init__(ctx=ctx, name=name)
        self.dtype = np.dtype(dtype)
        self.initializer = initializer
        self.value = None if value is None else np.asarray(value, dtype=self.dtype)
        if self.value is not None:
            self.shape = tuple(self.value.shape)
        elif initializer is not None:
            self.shape = tuple(initializer.shape)
        else:
            self.shape = None if shape is None else tuple(shape)
        self.trainable = trainable and self.is_parameter
        self.dynamic = None   # hetu.dynamic.DynamicTable of a dynamic embedding table (ht.layers.Embedding)

    @property
    def is_parameter(self):
        return self.value is not None or self.initializer is not None

    @property
    def is_placeholder(self):
        return not self.is_parameter

    def infer_shape(self, input_shapes):
        return self.shape

    def infer_dtype(self, input_dtypes):
        return self.dtype

    def gradient(self, output_grad):
        return []


def placeholder_op(name, dtype=np.float32, shape=None, ctx=None):
    return Variable(name, dtype=dtype, shape=shape, ctx=ctx)


def topo_sort(nodes):
    """Post-order of everything the given nodes depend on (inputs before users)."""
    order, visited = [], set()
    for root in nodes:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node.id in visited:
                continue
            visited.add(node.id)
            stack.append((node, True))
            for x in reversed(node.inputs):
                if x.id not in visited:
                    stack.append((x, False))
    return order


def print_graph(nodes):
    """One line per node, in execution order: what will run."""
    return "\n".join(repr(n) for n in topo_sort(nodes))
