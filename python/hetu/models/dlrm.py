"""DLRM (Naumov et al., 2019; MLPerf's recommendation model): a bottom MLP over the dense
features, the pooled embedding of every field (one bag per field: multi-hot fields are summed),
the dot product of every pair of those vectors, and a top MLP over the pairs and the bottom
MLP's output.

The paper's model reads the ids only through those dot products: it has no first-order term, and
over ids alone (MovieLens without dense input) it lost to a logistic regression on the same ids.
Its logit here adds one, as DeepFM and Wide & Deep carry it: a weight per id (`dlrm_first_order`,
a width-1 table, each field's bag summed, summed over the fields) plus, with dense features, a
linear layer over them (`dlrm_dense_linear`)."""
import hetu as ht

from .common import Architecture, dense_of, embed_bags, finish, first_order, mlp


def pairwise_dots(vectors, count):
    """vectors [batch, count, width] -> [batch, count * (count - 1) / 2]: the dot product of every
    pair (i, j), i > j (the Gram matrix's strict lower triangle, row by row, as DLRM takes it)."""
    return ht.lower_triangle_op(ht.matmul_op(vectors, vectors, trans_B=True)), count * (count - 1) // 2


def dlrm(dense_input, sparse_input, y_, fields, embedding_size=16, bottom=(64, 32), top=(128, 64), optimizer=None):
    """Every field of the data, each a bag (a single id is a bag of one), and its dense features."""
    dense_input = dense_of(dense_input, fields)
    pooled = embed_bags(sparse_input, fields.num_embeddings, embedding_size, fields.slots, dynamic=fields.dynamic)   # [batch, fields, width]
    vectors, count = pooled, fields.count
    if dense_input is not None:
        dense = mlp(fields.num_dense, tuple(bottom) + (embedding_size,), "dlrm_bottom", logit=False)(dense_input)
        vectors = ht.concat_op(ht.array_reshape_op(dense, (-1, 1, embedding_size)), pooled, axis=1)
        count += 1
    dots, num_pairs = pairwise_dots(vectors, count)
    top_in, width = dots, num_pairs
    if dense_input is not None:
        top_in, width = ht.concat_op(dense, dots, axis=1), num_pairs + embedding_size
    logit = mlp(width, top, "dlrm_top")(top_in) + first_order(sparse_input, dense_input, fields, "dlrm_first_order",
                                                               dense_name="dlrm_dense_linear")
    return finish(logit, y_, optimizer)


DLRM = Architecture("dlrm", dlrm, reads_bags=True)
