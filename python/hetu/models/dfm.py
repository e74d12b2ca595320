"""DeepFM (Guo et al., 2017): first-order weights, factorisation-machine pairwise interactions and an
MLP, summed. The paper's first-order term is FM's linear part, a weight per id
(`fm_first_order`); the dense features, which the paper's data has none of, get a linear layer
(`dfm_dense_linear`) beside it: the model contains a logistic regression as it is."""
import hetu as ht
from hetu import layers

from .common import Architecture, dense_of, embed_fields, finish, mlp


def dfm(dense_input, sparse_input, y_, fields, embedding_size=128, hidden=(256, 256, 256), optimizer=None):
    num_embeddings, num_fields, num_dense = fields.num_embeddings, fields.count, fields.num_dense
    dense_input = dense_of(dense_input, fields)
    _, first_order = embed_fields(sparse_input, num_embeddings, 1, num_fields, name="fm_first_order",
                                   dynamic=fields.dynamic)
    _, embedded = embed_fields(sparse_input, num_embeddings, embedding_size, num_fields, name="embedding",
                                dynamic=fields.dynamic)
    linear = ht.reduce_sum_op(first_order, axes=1, keepdims=True)
    # FM: 0.5 * ((sum_f v_f)^2 - sum_f v_f^2), summed over the embedding dimension.
    v = ht.array_reshape_op(embedded, (-1, num_fields, embedding_size))
    sum_v = ht.reduce_sum_op(v, axes=1)
    pairwise = ht.reduce_sum_op(sum_v * sum_v - ht.reduce_sum_op(v * v, axes=1), axes=1, keepdims=True) * 0.5
    deep_in = embedded if dense_input is None else ht.concat_op(embedded, dense_input, axis=1)
    logit = linear + pairwise + mlp(num_fields * embedding_size + num_dense, hidden, "dfm_deep")(deep_in)
    if dense_input is not None:
        logit = logit + layers.Linear(num_dense, 1, name="dfm_dense_linear")(dense_input)
    return finish(logit, y_, optimizer)


DFM = Architecture("dfm", dfm, reads_bags=False)
