"""DLRM (Naumov et al., 2019; MLPerf's recommendation model): a bottom MLP over the dense
features, the pooled embedding of every field (one bag per field: multi-hot fields are summed),
the dot product of every pair of those vectors, and a top MLP over the pairs and the bottom
MLP's output."""
import hetu as ht

from .common import embed_bags, finish, mlp


def pairwise_dots(vectors, count):
    """vectors [batch, count, width] -> [batch, count * (count - 1) / 2]: the dot product of every
    pair (i, j), i > j (the Gram matrix's strict lower triangle, row by row, as DLRM takes it)."""
    return ht.lower_triangle_op(ht.matmul_op(vectors, vectors, trans_B=True)), count * (count - 1) // 2


def dlrm(dense_input, sparse_input, y_, num_embeddings, field_slots, num_dense, embedding_size=16,
         bottom=(64, 32), top=(128, 64), optimizer=None):
    """field_slots: the id columns of each field (1 for a single id, k for a bag of k slots)."""
    num_fields = len(field_slots)
    pooled = embed_bags(sparse_input, num_embeddings, embedding_size, field_slots)   # [batch, fields, width]
    vectors, count = pooled, num_fields
    if dense_input is not None:
        dense = mlp(num_dense, tuple(bottom) + (embedding_size,), "dlrm_bottom", logit=False)(dense_input)
        vectors = ht.concat_op(ht.array_reshape_op(dense, (-1, 1, embedding_size)), pooled, axis=1)
        count += 1
    dots, num_pairs = pairwise_dots(vectors, count)
    top_in, width = dots, num_pairs
    if dense_input is not None:
        top_in, width = ht.concat_op(dense, dots, axis=1), num_pairs + embedding_size
    logit = mlp(width, top, "dlrm_top")(top_in)
    return finish(logit, y_, optimizer)


def dlrm_criteo(dense_input, sparse_input, y_, num_embeddings=33762577, embedding_size=16, optimizer=None,
                field_slots=(1,) * 26):
    return dlrm(dense_input, sparse_input, y_, num_embeddings, field_slots, 13, embedding_size, optimizer=optimizer)


def dlrm_movielens(dense_input, sparse_input, y_, num_embeddings=6040 + 3706, embedding_size=16, optimizer=None,
                   field_slots=(1, 1)):
    """The rating's user and item and every side feature the data has (genres as one bag)."""
    return dlrm(None, sparse_input, y_, num_embeddings, field_slots, 0, embedding_size, optimizer=optimizer)
