"""ht.layers: callable building blocks that create their parameters once and add ops to the
graph each time they are called."""
from . import init
from .ops import (activation, array_reshape_op, batch_normalization_op, concatenate_op, dropout_op,
                  embedding_bag_op, embedding_lookup_op, layer_normalization_op, linear_op, sum_op)


class Layer:
    def __call__(self, *args):
        return self.forward(*args)


class Linear(Layer):
    def __init__(self, in_features, out_features, initializer=init.xavier_normal, bias=True, activation=None,
                 name="linear", ctx=None):
        self.weight = initializer((in_features, out_features), name=f"{name}_weight", ctx=ctx)
        self.bias = init.zeros((out_features,), name=f"{name}_bias", ctx=ctx) if bias else None
        self.activation = activation

    def forward(self, x):
        # One op for the product, the bias and a ReLU (LinearOp); another activation follows it.
        fused_relu = self.activation is activation.relu_op
        y = linear_op(x, self.weight, self.bias, relu=fused_relu)
        return self.activation(y) if self.activation is not None and not fused_relu else y


class Embedding(Layer):
    """A table of `num_embeddings` rows looked up by ids; with `dynamic` (hetu.dynamic.DynamicTable)
    a dynamic table of `dynamic.capacity` rows looked up by any int64 keys (num_embeddings None or
    the capacity)."""

    def __init__(self, num_embeddings, embedding_dim, initializer=init.random_normal, name="embedding", ctx=None,
                 dynamic=None):
        if dynamic is not None:
            if num_embeddings not in (None, dynamic.capacity):
                raise ValueError(f"Embedding {name}: {num_embeddings} rows but a dynamic table of capacity "
                                 f"{dynamic.capacity}: give num_embeddings=None or the capacity")
            num_embeddings = dynamic.capacity
        if initializer is init.random_normal:
            self.embedding_table = init.random_normal((num_embeddings, embedding_dim), stddev=0.01, name=name, ctx=ctx)
        else:
            self.embedding_table = initializer((num_embeddings, embedding_dim), name=name, ctx=ctx)
        self.embedding_table.dynamic = dynamic

    def forward(self, ids):
        return embedding_lookup_op(self.embedding_table, ids)


class EmbeddingBag(Embedding):
    """A table whose rows are pooled per bag (multi-hot fields): ids [samples, slots] with -1 in
    empty slots; `slots`, the slot count of each bag ([samples, bags, dim] out), or None for one
    bag of all the slots ([samples, dim] out); `mode` "sum" or "mean"."""

    def __init__(self, num_embeddings, embedding_dim, mode="sum", slots=None, initializer=init.random_normal,
                 name="embedding", ctx=None, dynamic=None):
        super().__init__(num_embeddings, embedding_dim, initializer, name, ctx, dynamic)
        self.mode, self.slots = mode, slots

    def forward(self, ids):
        return embedding_bag_op(self.embedding_table, ids, self.slots, self.mode)


class Sequence(Layer):
    def __init__(self, *layers):
        self.layers = layers

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class _Fn(Layer):
    fn = None

    def forward(self, x):
        return type(self).fn(x)


class Relu(_Fn):
    fn = staticmethod(activation.relu_op)


class Sigmoid(_Fn):
    fn = staticmethod(activation.sigmoid_op)


class Tanh(_Fn):
    fn = staticmethod(activation.tanh_op)


class Identity(Layer):
    def forward(self, x):
        return x


class Concatenate(Layer):
    def __init__(self, axis=0):
        self.axis = axis

    def forward(self, *xs):
        xs = xs[0] if len(xs) == 1 and isinstance(xs[0], (list, tuple)) else xs
        return concatenate_op(list(xs), axis=self.axis)


class Sum(Layer):
    def forward(self, *xs):
        xs = xs[0] if len(xs) == 1 and isinstance(xs[0], (list, tuple)) else xs
        return sum_op(list(xs))


class Reshape(Layer):
    def __init__(self, shape):
        self.shape = shape

    def forward(self, x):
        return array_reshape_op(x, self.shape)


class Dropout(Layer):
    """p is the drop probability."""

    def __init__(self, p=0.5):
        self.keep_prob = 1.0 - p

    def forward(self, x):
        return dropout_op(x, self.keep_prob)


class BatchNorm(Layer):
    def __init__(self, num_channels, momentum=0.99, eps=0.01, name="batchnorm", ctx=None):
        self.scale = init.ones((num_channels,), name=f"{name}_scale", ctx=ctx)
        self.bias = init.zeros((num_channels,), name=f"{name}_bias", ctx=ctx)
        self.momentum, self.eps = momentum, eps

    def forward(self, x):
        return batch_normalization_op(x, self.scale, self.bias, self.momentum, self.eps)


class LayerNorm(Layer):
    def __init__(self, dim, eps=0.01, name="layernorm", ctx=None):
        self.scale = init.ones((dim,), name=f"{name}_scale", ctx=ctx)
        self.bias = init.zeros((dim,), name=f"{name}_bias", ctx=ctx)
        self.eps = eps

    def forward(self, x):
        return layer_normalization_op(x, self.scale, self.bias, self.eps)
