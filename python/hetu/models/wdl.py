"""Wide & Deep (Cheng et al., 2016): a linear (wide) part plus an MLP (deep) part on the embedded
categorical fields and the dense features. The paper's wide part is a linear model over the raw
sparse features (and their crosses) as well as the dense ones: it reads the ids through a weight
per id (`wdl_wide_ids`, a width-1 table summed over the fields) beside the dense features'
linear layer (`wdl_wide`), so the model contains a logistic regression on the same inputs."""
import hetu as ht

from .common import Architecture, dense_of, embed_fields, finish, first_order, mlp


def wdl(dense_input, sparse_input, y_, fields, embedding_size=128, hidden=(256, 256, 256), optimizer=None):
    num_dense, dense_input = fields.num_dense, dense_of(dense_input, fields)
    _, embedded = embed_fields(sparse_input, fields.num_embeddings, embedding_size, fields.count,
                               dynamic=fields.dynamic)
    deep_in = embedded if dense_input is None else ht.concat_op(embedded, dense_input, axis=1)
    logit = mlp(fields.count * embedding_size + num_dense, hidden, "wdl_deep")(deep_in)
    logit = logit + first_order(sparse_input, dense_input, fields, "wdl_wide_ids", dense_name="wdl_wide")
    return finish(logit, y_, optimizer)


WDL = Architecture("wdl", wdl, reads_bags=False)
