"""Deep & Cross Network: explicit feature crosses x_{l+1} = x0 (x_l . w_l) + b_l + x_l beside an MLP."""
import hetu as ht
from hetu import init, layers

from .common import Architecture, dense_of, embed_fields, finish


def cross_layer(x0, x, width, name):
    w = init.random_normal((width, 1), stddev=0.01, name=f"{name}_w")
    b = init.zeros((width,), name=f"{name}_b")
    xw = ht.matmul_op(x, w)                       # [batch, 1]
    return x0 * ht.broadcastto_op(xw, x0) + ht.broadcastto_op(b, x0) + x


def dcn(dense_input, sparse_input, y_, fields, embedding_size=128, num_cross=3, hidden=(256, 256), optimizer=None):
    dense_input = dense_of(dense_input, fields)
    _, embedded = embed_fields(sparse_input, fields.num_embeddings, embedding_size, fields.count,
                               dynamic=fields.dynamic)
    x0 = embedded if dense_input is None else ht.concat_op(embedded, dense_input, axis=1)
    width = fields.count * embedding_size + fields.num_dense
    x = x0
    for i in range(num_cross):
        x = cross_layer(x0, x, width, f"dcn_cross{i}")
    deep = layers.Sequence(*[layers.Linear(w_in, w_out, activation=ht.relu_op, name=f"dcn_deep{i}")
                             for i, (w_in, w_out) in enumerate(zip((width,) + hidden[:-1], hidden))])(x0)
    logit = layers.Linear(width + hidden[-1], 1, name="dcn_out")(ht.concat_op(x, deep, axis=1))
    return finish(logit, y_, optimizer)


DCN = Architecture("dcn", dcn, reads_bags=False)
