"""Deep & Cross Network: explicit feature crosses x_{l+1} = x0 (x_l . w_l) + b_l + x_l beside an MLP."""
import hetu as ht
from hetu import init, layers

from .common import embed_fields, finish


def cross_layer(x0, x, width, name):
    w = init.random_normal((width, 1), stddev=0.01, name=f"{name}_w")
    b = init.zeros((width,), name=f"{name}_b")
    xw = ht.matmul_op(x, w)                       # [batch, 1]
    return x0 * ht.broadcastto_op(xw, x0) + ht.broadcastto_op(b, x0) + x


def dcn(dense_input, sparse_input, y_, num_embeddings, num_fields, num_dense, embedding_size=128,
        num_cross=3, hidden=(256, 256), optimizer=None):
    _, embedded = embed_fields(sparse_input, num_embeddings, embedding_size, num_fields)
    x0 = embedded if dense_input is None else ht.concat_op(embedded, dense_input, axis=1)
    width = num_fields * embedding_size + num_dense
    x = x0
    for i in range(num_cross):
        x = cross_layer(x0, x, width, f"dcn_cross{i}")
    deep = layers.Sequence(*[layers.Linear(w_in, w_out, activation=ht.relu_op, name=f"dcn_deep{i}")
                             for i, (w_in, w_out) in enumerate(zip((width,) + hidden[:-1], hidden))])(x0)
    logit = layers.Linear(width + hidden[-1], 1, name="dcn_out")(ht.concat_op(x, deep, axis=1))
    return finish(logit, y_, optimizer)


def dcn_criteo(dense_input, sparse_input, y_, num_embeddings=33762577, embedding_size=128, optimizer=None):
    return dcn(dense_input, sparse_input, y_, num_embeddings, 26, 13, embedding_size, optimizer=optimizer)


def dcn_avazu(dense_input, sparse_input, y_, num_embeddings=9449445, embedding_size=128, optimizer=None):
    return dcn(None, sparse_input, y_, num_embeddings, 22, 0, embedding_size, optimizer=optimizer)
