"""Pieces every CTR model shares: what an architecture is, the embedding tables, the MLP tower,
the loss and train op."""
from dataclasses import dataclass
from typing import Callable

import hetu as ht
from hetu import layers


@dataclass(frozen=True)
class Architecture:
    """A model function, build(dense_input, sparse_input, y_, fields, embedding_size=..., optimizer=None)
    -> (loss, prediction, y_, train_op), over any data's hetu.data.Fields. `reads_bags`: it pools each
    field's slots, so it reads multi-hot fields; else it reads one id per field. `num_fields`: the
    fields it reads (None: any number)."""
    name: str
    build: Callable
    reads_bags: bool
    num_fields: int = None

    def refusal(self, fields):
        """Why this architecture cannot read `fields`, or None."""
        if not self.reads_bags and fields.multi_hot:
            return f"{self.name} reads one id per field, and the data's fields {', '.join(fields.bags)} are multi-hot"
        if self.num_fields is not None and fields.count != self.num_fields:
            return f"{self.name} reads {self.num_fields} fields, and the data has {fields.count}"
        return None


def dense_of(dense_input, fields):
    """The dense features' input, None when the data has none."""
    return dense_input if fields.num_dense else None


def embed_fields(sparse_input, num_embeddings, embedding_size, num_fields, name="embedding", dynamic=None):
    """One table for all fields (they share one id space; with `dynamic`, a dynamic table's key
    space) -> [batch, num_fields * embedding_size]."""
    table = layers.Embedding(num_embeddings, embedding_size, name=name, dynamic=dynamic)
    rows = table(sparse_input)
    return table, ht.array_reshape_op(rows, (-1, num_fields * embedding_size))


def embed_bags(sparse_input, num_embeddings, embedding_size, field_slots, name="embedding", dynamic=None):
    """One table for all fields, each field's ids pooled by sum (a field of one id is a bag of one)
    -> [batch, fields, embedding_size]."""
    return layers.EmbeddingBag(num_embeddings, embedding_size, mode="sum", slots=tuple(field_slots), name=name,
                               dynamic=dynamic)(
        sparse_input)


def first_order(sparse_input, dense_input, fields, name, dense_name=None):
    """The first-order (linear) term: a logistic regression's logit -> [batch, 1]. A weight per id
    (table `name`, width 1, a field's bag pooled by sum) summed over the fields, plus, where the
    data has dense features, a linear layer over them (`dense_name`, default `name`_dense). The
    table reads the same keys as the model's embeddings: with `fields.dynamic`, a dynamic table of
    the same key space."""
    weights = embed_bags(sparse_input, fields.num_embeddings, 1, fields.slots, name=name,
                         dynamic=fields.dynamic)   # [batch, fields, 1]
    logit = ht.reduce_sum_op(ht.array_reshape_op(weights, (-1, fields.count)), axes=1, keepdims=True)
    if dense_input is not None:
        logit = logit + layers.Linear(fields.num_dense, 1, name=dense_name or f"{name}_dense")(dense_input)
    return logit


def mlp(in_features, hidden, name, logit=True):
    """Linear+ReLU layers, then (with `logit`) a linear layer to one logit."""
    blocks, width = [], in_features
    for i, h in enumerate(hidden):
        blocks.append(layers.Linear(width, h, activation=ht.relu_op, name=f"{name}_fc{i}"))
        width = h
    if logit:
        blocks.append(layers.Linear(width, 1, name=f"{name}_out"))
    return layers.Sequence(*blocks)


def default_optimizer(optimizer):
    return optimizer if optimizer is not None else ht.optim.SGDOptimizer(learning_rate=0.01)


def finish(logit, y_, optimizer):
    """prediction, mean log loss over the batch, and the train op."""
    prediction = ht.sigmoid_op(logit)
    loss = ht.reduce_mean_op(ht.binarycrossentropywithlogits_op(logit, y_), [0])
    train_op = default_optimizer(optimizer).minimize(loss)
    return loss, prediction, y_, train_op
