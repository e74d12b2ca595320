"""Deep & Cross Network (Wang et al., 2017): explicit feature crosses x_{l+1} = x0 (x_l . w_l) + b_l
+ x_l beside an MLP. The paper's first-order term is the cross network's residual path, which
carries x0 (the embeddings and dense features) linearly to the output layer: a per-id weight only
as a projection of the id's shared embedding. It is made explicit here as in DeepFM: a weight per
id (`dcn_first_order`, a width-1 table summed over the fields) and a linear layer on the dense
features (`dcn_dense_linear`) added to the logit, so the model contains a logistic regression."""
import hetu as ht
from hetu import init, layers

from .common import Architecture, dense_of, embed_fields, finish, first_order


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
    logit = logit + first_order(sparse_input, dense_input, fields, "dcn_first_order", dense_name="dcn_dense_linear")
    return finish(logit, y_, optimizer)


DCN = Architecture("dcn", dcn, reads_bags=False)
