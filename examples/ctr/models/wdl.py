"""Wide & Deep: a linear (wide) part on the dense features plus an MLP (deep) part on the
embedded categorical fields and the dense features."""
import hetu as ht
from hetu import layers

from .common import Architecture, dense_of, embed_fields, finish, mlp


def wdl(dense_input, sparse_input, y_, fields, embedding_size=128, hidden=(256, 256, 256), optimizer=None):
    num_dense, dense_input = fields.num_dense, dense_of(dense_input, fields)
    _, embedded = embed_fields(sparse_input, fields.num_embeddings, embedding_size, fields.count,
                               dynamic=fields.dynamic)
    deep_in = embedded if dense_input is None else ht.concat_op(embedded, dense_input, axis=1)
    logit = mlp(fields.count * embedding_size + num_dense, hidden, "wdl_deep")(deep_in)
    if dense_input is not None:
        logit = logit + layers.Linear(num_dense, 1, name="wdl_wide")(dense_input)
    return finish(logit, y_, optimizer)


WDL = Architecture("wdl", wdl, reads_bags=False)
