"""DCN-V2 (Wang et al., 2021; MLPerf's DLRM-DCNv2): cross layers x_{l+1} = x0 * (W_l x_l + b_l) +
x_l with a full (or, with `rank`, a low-rank U_l V_l) matrix, stacked under a deep MLP, over the
pooled field embeddings (multi-hot fields summed per bag) and the dense features. In the stacked
form x0 reaches the logit only through the deep MLP (the paper's parallel form keeps a linear path
through its output layer): a weight per id (`dcnv2_first_order`, a width-1 table, bags summed,
summed over the fields) and a linear layer on the dense features (`dcnv2_dense_linear`) are added
to the logit, so the model contains a logistic regression."""
import hetu as ht
from hetu import init, layers

from .common import Architecture, dense_of, embed_bags, finish, first_order, mlp


def cross_layer_v2(x0, x, width, rank, name):
    if rank is None:
        projected = layers.Linear(width, width, name=f"{name}_w")(x)
    else:
        down = ht.matmul_op(x, init.random_normal((width, rank), stddev=(1.0 / width) ** 0.5, name=f"{name}_v"))
        projected = layers.Linear(rank, width, name=f"{name}_u")(down)
    return x0 * projected + x


def dcnv2(dense_input, sparse_input, y_, fields, embedding_size=16, num_cross=3, rank=None, hidden=(256, 128),
          optimizer=None):
    dense_input = dense_of(dense_input, fields)
    pooled = embed_bags(sparse_input, fields.num_embeddings, embedding_size, fields.slots, dynamic=fields.dynamic)
    width = fields.count * embedding_size
    x0 = ht.array_reshape_op(pooled, (-1, width))
    if dense_input is not None:
        x0, width = ht.concat_op(x0, dense_input, axis=1), width + fields.num_dense
    x = x0
    for i in range(num_cross):
        x = cross_layer_v2(x0, x, width, rank, f"dcnv2_cross{i}")
    logit = mlp(width, hidden, "dcnv2_deep")(x) + first_order(sparse_input, dense_input, fields, "dcnv2_first_order",
                                                             dense_name="dcnv2_dense_linear")
    return finish(logit, y_, optimizer)


DCNV2 = Architecture("dcnv2", dcnv2, reads_bags=True)
