"""ht.layers: callable building blocks that create their parameters once and add ops to the
graph each time they are called."""
from . import init
from . import ops
from .ops import (activation, array_reshape_op, batch_normalization_op, concatenate_op, dropout_op,
                  embedding_bag_op, embedding_lookup_op, layer_normalization_op, linear_op, sum_op)


class Layer:
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


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
    """p is the drop probability; `per_sample`: masks keyed by each sample and the op's name
    (DropoutOp), which the layer's `name` fixes, with a count where it is called again."""

    def __init__(self, p=0.5, per_sample=False, name=None):
        self.keep_prob = 1.0 - p
        self.per_sample = per_sample
        self.name, self.calls = name, 0

    def forward(self, x):
        if self.keep_prob == 1.0:
            return x
        name = None if self.name is None else f"{self.name}{'' if not self.calls else self.calls}"
        self.calls += 1
        return dropout_op(x, self.keep_prob, self.per_sample, name=name)


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


# --- sequences: attention over user histories (docs/design.md section 17) ----------------------------
def _positionwise(layer, x, width_in, width_out, length):
    """A Linear over the last axis of x [batch, length, width_in] -> [batch, length, width_out]."""
    return array_reshape_op(layer(array_reshape_op(x, (-1, width_in))), (-1, length, width_out))


def _heads(x, length, heads, width):
    """[batch, length, heads * width] -> [batch, heads, length, width]."""
    return ops.transpose_op(array_reshape_op(x, (-1, length, heads, width)), (0, 2, 1, 3))


def _merge_heads(x, length, heads, width):
    return array_reshape_op(ops.transpose_op(x, (0, 2, 1, 3)), (-1, length, heads * width))


class MultiHeadAttention(Layer):
    """Causal multi-head self-attention over x [batch, length, dim] with a padding mask [batch,
    length] (1: filled): softmax(q k^T / sqrt(dim / heads)) v, dropout on the attention weights,
    and an output projection; PyTorch's nn.MultiheadAttention in its parameters (q, k, v and out
    projections; q, v and out with a bias). Dropout masks are per sample (DropoutOp)."""

    def __init__(self, dim, heads, length, dropout=0.0, causal=True, name="mha", ctx=None):
        if dim % heads:
            raise ValueError(f"MultiHeadAttention {name}: dim {dim} is not a multiple of heads {heads}")
        self.dim, self.heads, self.length, self.causal = dim, heads, length, causal
        # The key projection has no bias: a softmax over keys does not change when every score
        # of a query moves by the same q . b_k, so its gradient is rounding noise, which Adam
        # would turn into full-size steps.
        self.q, self.k, self.v, self.out = (Linear(dim, dim, bias=part != "k", name=f"{name}_{part}", ctx=ctx)
                                            for part in ("q", "k", "v", "out"))
        self.dropout = Dropout(dropout, per_sample=True, name=f"{name}_dropout")

    def forward(self, query, key_value, mask):
        d, h, n = self.dim, self.heads, self.length
        q, k, v = (_heads(_positionwise(proj, x, d, d, n), n, h, d // h)
                   for proj, x in ((self.q, query), (self.k, key_value), (self.v, key_value)))
        weights = ops.masked_softmax_op(ops.matmul_op(q, k, trans_B=True), mask, causal=self.causal,
                                        scale=(d // h) ** -0.5)
        attended = _merge_heads(ops.matmul_op(self.dropout(weights), v), n, h, d // h)
        return _positionwise(self.out, attended, d, d, n)


class HSTUBlock(Layer):
    """One HSTU layer (Zhai et al. 2024, generative-recommenders' SequentialTransductionUnit):
    u, v, q, k = silu(x' W + b) for x' = LayerNorm(x) (no affine parameters); attention weights
    silu(q k^T + position bias + time bias) / length over the causal, filled positions; output
    x + W_o dropout(u * LayerNorm(weights v)) + b_o. `times`: an int64 [batch, length] node of
    timestamps, or None for the position bias alone."""

    def __init__(self, dim, heads, length, linear_dim=None, attention_dim=None, dropout=0.0, time_buckets=128,
                 name="hstu", ctx=None):
        self.dim, self.heads, self.length = dim, heads, length
        self.linear_dim = linear_dim or dim // heads
        self.attention_dim = attention_dim or dim // heads
        self.time_buckets = time_buckets
        width = heads * (2 * self.linear_dim + 2 * self.attention_dim)
        self.uvqk = Linear(dim, width, name=f"{name}_uvqk", ctx=ctx)
        self.out = Linear(heads * self.linear_dim, dim, name=f"{name}_out", ctx=ctx)
        self.position_bias = init.zeros((2 * length - 1,), name=f"{name}_position_bias", ctx=ctx)
        self.time_bias = init.zeros((time_buckets,), name=f"{name}_time_bias", ctx=ctx)
        self.position_index = ops.int_constant_op(ops.relative_position_buckets(length), name=f"{name}_positions")
        self.dropout = Dropout(dropout, per_sample=True, name=f"{name}_dropout")
        self._unit_norm = (init.ones((dim,), name=f"{name}_norm_scale", trainable=False, ctx=ctx),
                           init.zeros((dim,), name=f"{name}_norm_bias", trainable=False, ctx=ctx))
        self._out_norm = (init.ones((heads * self.linear_dim,), name=f"{name}_out_norm_scale", trainable=False,
                                    ctx=ctx),
                          init.zeros((heads * self.linear_dim,), name=f"{name}_out_norm_bias", trainable=False,
                                     ctx=ctx))

    def forward(self, x, mask, times=None, time_index=None):
        """`time_index`: time_bucket_op(times, time_buckets), given where several blocks read the
        same timestamps (computed once), else computed here from `times`."""
        d, h, n, lin, att = self.dim, self.heads, self.length, self.linear_dim, self.attention_dim
        normed = layer_normalization_op(x, *self._unit_norm, eps=1e-6)
        uvqk = ops.silu_op(_positionwise(self.uvqk, normed, d, h * (2 * lin + 2 * att), n))
        u = ops.slice_op(uvqk, (0, 0, 0), (-1, -1, h * lin))
        v = ops.slice_op(uvqk, (0, 0, h * lin), (-1, -1, h * lin))
        q = ops.slice_op(uvqk, (0, 0, 2 * h * lin), (-1, -1, h * att))
        k = ops.slice_op(uvqk, (0, 0, 2 * h * lin + h * att), (-1, -1, h * att))
        scores = ops.matmul_op(_heads(q, n, h, att), _heads(k, n, h, att), trans_B=True)   # [batch, h, n, n]
        bias = ops.relative_bias_op(self.position_bias, self.position_index)   # [n, n]
        if time_index is None and times is not None:
            time_index = ops.time_bucket_op(times, self.time_buckets)
        if time_index is not None:
            time_bias = ops.relative_bias_op(self.time_bias, time_index)
            bias = bias + array_reshape_op(time_bias, (-1, 1, n, n))
        weights = ops.pointwise_attention_op(scores + bias, mask, causal=True)
        attended = _merge_heads(ops.matmul_op(weights, _heads(v, n, h, lin)), n, h, lin)
        gated = u * layer_normalization_op(attended, *self._out_norm, eps=1e-6)
        return x + _positionwise(self.out, self.dropout(gated), h * lin, d, n)
