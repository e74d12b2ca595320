"""Logistic regression, the linear baseline every model is measured against: a weight per id of
every field (`lr_weights`, a width-1 table, a multi-hot field's bag summed) plus a linear layer on
the dense features (`lr_dense`), the first-order term the other models carry beside their
interactions. It trains through the same driver, modes and optimizers as they do."""
from .common import Architecture, dense_of, finish, first_order


def lr(dense_input, sparse_input, y_, fields, embedding_size=None, optimizer=None):
    """`embedding_size` is accepted and not read: a logistic regression's table has width 1."""
    logit = first_order(sparse_input, dense_of(dense_input, fields), fields, "lr_weights", dense_name="lr_dense")
    return finish(logit, y_, optimizer)


LR = Architecture("lr", lr, reads_bags=True)
