"""Neural collaborative filtering (NeuMF) for MovieLens: GMF and MLP branches over user and item
embeddings. Users and items share one table: item ids are offset by the number of users.
NeuMF's published form has no bias per user or item (GMF's h . (p_u * q_i) can only learn one
through a constant coordinate); the user and item biases of matrix factorisation, a logistic
regression on the two ids, are added to the logit (`ncf_first_order`, a width-1 table)."""
import hetu as ht
from hetu import layers

from .common import Architecture, finish, first_order, mlp


def ncf(dense_input, sparse_input, y_, fields, embedding_size=64, hidden=(128, 64), optimizer=None):
    """sparse_input: [batch, 2] (user id, offset item id); dense features are not read."""
    gmf_table = layers.Embedding(fields.num_embeddings, embedding_size, name="ncf_gmf_embedding",
                                 dynamic=fields.dynamic)
    mlp_table = layers.Embedding(fields.num_embeddings, embedding_size, name="ncf_mlp_embedding",
                                 dynamic=fields.dynamic)
    gmf = ht.array_reshape_op(gmf_table(sparse_input), (-1, 2, embedding_size))
    user = ht.array_reshape_op(ht.slice_op(gmf, (0, 0, 0), (-1, 1, -1)), (-1, embedding_size))
    item = ht.array_reshape_op(ht.slice_op(gmf, (0, 1, 0), (-1, 1, -1)), (-1, embedding_size))
    mlp_in = ht.array_reshape_op(mlp_table(sparse_input), (-1, 2 * embedding_size))
    deep = mlp(2 * embedding_size, hidden, "ncf_mlp", logit=False)(mlp_in)
    both = ht.concat_op(user * item, deep, axis=1)
    logit = layers.Linear(embedding_size + hidden[-1], 1, name="ncf_out")(both)
    logit = logit + first_order(sparse_input, None, fields, "ncf_first_order")
    return finish(logit, y_, optimizer)


NCF = Architecture("ncf", ncf, reads_bags=False, num_fields=2)
