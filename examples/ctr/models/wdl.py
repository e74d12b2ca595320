"""Wide & Deep: a linear (wide) part on the dense features plus an MLP (deep) part on the
embedded categorical fields and the dense features."""
import hetu as ht
from hetu import layers

from .common import embed_fields, finish, mlp


def wdl(dense_input, sparse_input, y_, num_embeddings, num_fields, num_dense, embedding_size=128,
        hidden=(256, 256, 256), optimizer=None):
    _, embedded = embed_fields(sparse_input, num_embeddings, embedding_size, num_fields)
    deep_in = embedded if dense_input is None else ht.concat_op(embedded, dense_input, axis=1)
    logit = mlp(num_fields * embedding_size + num_dense, hidden, "wdl_deep")(deep_in)
    if dense_input is not None:
        logit = logit + layers.Linear(num_dense, 1, name="wdl_wide")(dense_input)
    return finish(logit, y_, optimizer)


def wdl_criteo(dense_input, sparse_input, y_, num_embeddings=33762577, embedding_size=128, optimizer=None):
    return wdl(dense_input, sparse_input, y_, num_embeddings, 26, 13, embedding_size, optimizer=optimizer)


def wdl_avazu(dense_input, sparse_input, y_, num_embeddings=9449445, embedding_size=128, optimizer=None):
    return wdl(None, sparse_input, y_, num_embeddings, 22, 0, embedding_size, optimizer=optimizer)
