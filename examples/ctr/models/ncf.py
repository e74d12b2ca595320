"""Neural collaborative filtering (NeuMF) for MovieLens: GMF and MLP branches over user and item
embeddings. Users and items share one table: item ids are offset by the number of users."""
import hetu as ht
from hetu import layers

from .common import finish, mlp


def ncf(dense_input, sparse_input, y_, num_embeddings, embedding_size=64, hidden=(128, 64), optimizer=None):
    """sparse_input: [batch, 2] (user id, offset item id)."""
    gmf_table = layers.Embedding(num_embeddings, embedding_size, name="ncf_gmf_embedding")
    mlp_table = layers.Embedding(num_embeddings, embedding_size, name="ncf_mlp_embedding")
    gmf = ht.array_reshape_op(gmf_table(sparse_input), (-1, 2, embedding_size))
    user = ht.array_reshape_op(ht.slice_op(gmf, (0, 0, 0), (-1, 1, -1)), (-1, embedding_size))
    item = ht.array_reshape_op(ht.slice_op(gmf, (0, 1, 0), (-1, 1, -1)), (-1, embedding_size))
    mlp_in = ht.array_reshape_op(mlp_table(sparse_input), (-1, 2 * embedding_size))
    deep = mlp(2 * embedding_size, hidden, "ncf_mlp", logit=False)(mlp_in)
    both = ht.concat_op(user * item, deep, axis=1)
    logit = layers.Linear(embedding_size + hidden[-1], 1, name="ncf_out")(both)
    return finish(logit, y_, optimizer)


def ncf_movielens(dense_input, sparse_input, y_, num_embeddings=6040 + 3706, embedding_size=64, optimizer=None):
    return ncf(dense_input, sparse_input, y_, num_embeddings, embedding_size, optimizer=optimizer)
