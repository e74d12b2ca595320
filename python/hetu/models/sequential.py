"""Sequential recommenders over user histories (docs/design.md section 17): SASRec (Kang and
McAuley 2018; causal self-attention blocks over item plus position embeddings) and HSTU (Zhai et
al. 2024; pointwise attention with relative position and time biases, gated), both trained with a
sampled softmax at every position, as generative-recommenders trains them.

A sample's ids are one int64 row [inputs (L) | targets (L) | its distinct negatives (C)] read by
one lookup of the item table (hetu.ops.sequence): every row it reads passes one row source (a
process's own table, the parameter server, a cache); a second input says which candidate is each
position's j-th negative. Published MovieLens-1M configurations:
embedding 50, 2 blocks, 1 head, dropout 0.2, 128 negatives, temperature 0.05, AdamW lr 1e-3 betas
(0.9, 0.98), batch 128, L 200."""
from dataclasses import dataclass, field

import hetu as ht
from hetu import init, layers


@dataclass(frozen=True)
class SequenceConfig:
    """A sequential model's sizes; the defaults are the published MovieLens-1M configuration."""
    num_items: int
    max_length: int = 200
    num_negatives: int = 128
    embedding_size: int = 50
    blocks: int = 2
    heads: int = 1
    dropout: float = 0.2
    temperature: float = 0.05
    time_buckets: int = 128
    negatives: str = "uniform"   # "shared": N drawn once per global batch; "in-batch": from its targets

    @property
    def candidates(self):
        """Columns of a sample's distinct negatives: at most L x N (shared: N), at most the catalog."""
        most = self.num_negatives if self.negatives == "shared" else self.max_length * self.num_negatives
        return min(most, self.num_items)

    @property
    def id_columns(self):
        return 2 * self.max_length + self.candidates


# The published MovieLens-1M settings (no other optimizer or rate has been measured for these models).
SEQUENCE_DEFAULTS = {"optimizer": "adamw_catchup", "learning_rate": 1e-3,
                     "embedding_size": SequenceConfig.embedding_size}


@dataclass(frozen=True)
class SequentialModel:
    """A name of the command line for a sequential model: its architecture ("sasrec" or "hstu"),
    the dataset it trains on by default (None: the data given), and the optimizer, learning rate
    and embedding size it trains with unless told otherwise."""
    name: str
    architecture: str
    dataset: str = None
    optimizer: str = SEQUENCE_DEFAULTS["optimizer"]
    learning_rate: float = SEQUENCE_DEFAULTS["learning_rate"]
    embedding_size: int = SEQUENCE_DEFAULTS["embedding_size"]


SEQUENTIAL = {name: SequentialModel(name, architecture, dataset) for name, architecture, dataset in (
    ("sasrec", "sasrec", None), ("hstu", "hstu", None),
    ("sasrec_movielens", "sasrec", "movielens-sequences"), ("hstu_movielens", "hstu", "movielens-sequences"),
    ("sasrec_synthetic", "sasrec", "synthetic-sequences"), ("hstu_synthetic", "hstu", "synthetic-sequences"))}


@dataclass
class SequenceGraph:
    """The nodes a driver runs: the training loss and op, and the user vector at each history's
    last filled position with the item table (validation ranks every item by their product)."""
    loss: object
    train_op: object
    user: object
    item_table: object
    extra: dict = field(default_factory=dict)


def _truncated(std):
    def make(shape, name=None, ctx=None):
        return init.truncated_normal(shape, stddev=std, name=name, ctx=ctx)
    return make


def embed_history(ids, config, columns, dynamic=None):
    """The one lookup of the item table over ids [batch, columns]: (rows [batch, columns, d], the
    history's input [batch, L, d] as item embedding * sqrt(d) + a learned position embedding, the
    padding mask [batch, L])."""
    L, d = config.max_length, config.embedding_size
    table = layers.EmbeddingBag(None if dynamic else config.num_items, d, mode="sum",
                                slots=(1,) * columns, initializer=_truncated(0.02),
                                name="item_embedding", dynamic=dynamic)
    rows = table(ids)
    items = ht.slice_op(rows, (0, 0, 0), (-1, L, -1))
    positions = init.truncated_normal((L, d), stddev=0.02, name="position_embedding")
    x = items * (d ** 0.5) + positions
    mask = ht.sequence_mask_op(ids, L)
    return table, rows, x, mask


def _masked(x, mask, length):
    return x * ht.array_reshape_op(mask, (-1, length, 1))


def sasrec_encoder(x, mask, config, times=None):
    """SASRec's blocks as its reference code writes them: q = LayerNorm(x); x = q + attention(q, x);
    x = x + FFN(LayerNorm(x)) (ReLU, dropout); padding zeroed after each block; a last LayerNorm."""
    L, d = config.max_length, config.embedding_size
    x = _masked(layers.Dropout(config.dropout, per_sample=True, name="input_dropout")(x), mask, L)
    for i in range(config.blocks):
        q = layers.LayerNorm(d, eps=1e-8, name=f"sasrec{i}_attention_norm")(x)
        x = q + layers.MultiHeadAttention(d, config.heads, L, config.dropout, name=f"sasrec{i}_attention")(q, x, mask)
        x = layers.LayerNorm(d, eps=1e-8, name=f"sasrec{i}_ffn_norm")(x)
        hidden = layers._positionwise(layers.Linear(d, d, activation=ht.relu_op, name=f"sasrec{i}_ffn1"), x, d, d, L)
        hidden = layers.Dropout(config.dropout, per_sample=True, name=f"sasrec{i}_ffn_dropout1")(hidden)
        ffn = layers._positionwise(layers.Linear(d, d, name=f"sasrec{i}_ffn2"), hidden, d, d, L)
        x = _masked(x + layers.Dropout(config.dropout, per_sample=True, name=f"sasrec{i}_ffn_dropout2")(ffn), mask, L)
    return layers.LayerNorm(d, eps=1e-8, name="sasrec_last_norm")(x)


def hstu_encoder(x, mask, config, times=None):
    """HSTU's layers over the dropped-out input; padding zeroed after each."""
    L, d = config.max_length, config.embedding_size
    x = _masked(layers.Dropout(config.dropout, per_sample=True, name="input_dropout")(x), mask, L)
    time_index = None if times is None else ht.time_bucket_op(times, config.time_buckets)   # once for every block
    for i in range(config.blocks):
        block = layers.HSTUBlock(d, config.heads, L, dropout=config.dropout, time_buckets=config.time_buckets,
                                 name=f"hstu{i}")
        x = _masked(block(x, mask, time_index=time_index), mask, L)
    return x


ENCODERS = {"sasrec": sasrec_encoder, "hstu": hstu_encoder}


def user_vectors(kind, ids, times, config, columns, dynamic=None):
    """(the item table layer, its rows [batch, columns, d], the L2-normalised user vector at each
    position [batch, L, d]) of model `kind` over ids [batch, columns] whose first L are the history."""
    table, rows, x, mask = embed_history(ids, config, columns, dynamic)
    return table, rows, ht.l2_normalize_op(ENCODERS[kind](x, mask, config, times))


def build(kind, ids, negatives, times, config, optimizer, dynamic=None):
    """The graph of model `kind` ("sasrec" or "hstu") over ids [batch, 2L + C], the negatives'
    index [batch, L x N] into each sample's candidates (and times [batch, L] for HSTU's time
    bias, or None) -> SequenceGraph. The loss is the mean of the positions' sampled
    softmax losses over batch x L (a position without a target counts 0): summed over workers,
    the global batch's (docs/design.md section 4)."""
    table, rows, user = user_vectors(kind, ids, times, config, config.id_columns, dynamic)
    index = ht.array_reshape_op(negatives, (-1, config.max_length, config.num_negatives))
    per_position = ht.sampled_softmax_loss_op(user, rows, ids, index, config.max_length, config.temperature)
    loss = ht.reduce_mean_op(per_position)
    train_op = optimizer.minimize(loss)
    return SequenceGraph(loss, train_op, ht.last_valid_op(user, ids, config.max_length), table.embedding_table)


def serving(kind, history, times, config, dynamic=None):
    """(the user vector [batch, d] each history [batch, L] ends with, the item table): the forward
    that export writes to ONNX, with the parameters' names of training's graph."""
    table, _, user = user_vectors(kind, history, times, config, config.max_length, dynamic)
    return ht.last_valid_op(user, history, config.max_length), table.embedding_table
