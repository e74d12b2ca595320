"""The models of hetu's command lines (`--model NAME`), each a registry entry.

CTR models (MODELS): one function per architecture (wdl, dfm, dcn, ncf, dlrm, dcnv2, and lr: the
logistic regression they are measured against), each taking its fields, their slots and the dense
width from the data (hetu.data.Fields: a dataset's ``meta.fields``). A bare architecture name
trains on the data given; ``<arch>_<dataset>`` is the architecture on the dataset it is named for
(its synthetic shape, e.g. ``dlrm_criteo_multihot``: MLPerf's multi-hot Criteo), whose real shape
it takes when it is given no data.

Sequential models (SEQUENTIAL; hetu.models.sequential): SASRec and HSTU over user histories.
hetu.models.load_data loads the datasets the CTR names are named for, by name.

REGISTRY holds both: every name --model takes. Each entry carries the optimizer and learning rate
it trains with unless told otherwise (``entry.optimizer``, ``entry.learning_rate``)."""
from dataclasses import dataclass

from hetu.data import shape_fields

from .common import Architecture
from .dcn import DCN
from .dcnv2 import DCNV2
from .dfm import DFM
from .dlrm import DLRM
from .lr import LR
from .ncf import NCF
from .sequential import SEQUENCE_DEFAULTS, SEQUENTIAL, SequentialModel  # noqa: F401
from .wdl import WDL

ARCHITECTURES = {a.name: a for a in (WDL, DFM, DCN, NCF, DLRM, DCNV2, LR)}
# the names of README, docs, benches and tests: <arch>_<dataset>, the dataset "_" for the shape's "-"
NAMED = ("wdl_criteo", "wdl_avazu", "dfm_criteo", "dfm_avazu", "dcn_criteo", "dcn_avazu", "ncf_movielens",
         "dlrm_criteo", "dcnv2_criteo", "dlrm_movielens", "dlrm_criteo_multihot", "dcnv2_criteo_multihot",
         "lr_criteo", "lr_movielens", "lr_criteo_multihot")

# What a name whose quality was never measured trains with, sgd at 0.01 (the driver's default for
# every CTR model): wdl_avazu, dfm_avazu, dcn_avazu, dcnv2_criteo_multihot, lr_criteo_multihot.
UNMEASURED = ("sgd", 0.01)
# The (optimizer, learning rate) each name reached its best validation AUC with in one epoch, out
# of lazy adam, adam_catchup and adagrad, each at its better rate (docs/results/quality.md, "Every
# model against a logistic regression" and its adam_catchup and AdaGrad tables; in the comments
# that AUC, then the other two rules' best). A bare architecture trains on the data given: its
# pair on the real data measured, MovieLens 100K (the bag readers with its side features).
RECOMMENDED = {
    # MovieLens 100K with side features
    "dlrm": ("adagrad", 0.03),             # 0.7304 (adam_catchup 0.7254, adam 0.7144)
    "dcnv2": ("adagrad", 0.03),            # 0.7283 (adam_catchup 0.7207, adam 0.7133)
    "lr": ("adagrad", 0.1),                # 0.7064 (adam_catchup 0.7042, adam 0.6949)
    # MovieLens 100K, its user and item ids (the movielens shape)
    "wdl": ("adagrad", 0.03),              # 0.7284 (adam_catchup 0.7243, adam 0.7222)
    "dfm": ("adagrad", 0.03),              # 0.7293 (adam_catchup 0.7232, adam 0.7161)
    "dcn": ("adagrad", 0.03),              # 0.7301 (adam_catchup 0.7255, adam 0.7233)
    "ncf": ("adagrad", 0.03),              # 0.7302 (adam_catchup 0.7265, adam 0.7255)
    "ncf_movielens": ("adagrad", 0.03),
    "dlrm_movielens": ("adam_catchup", 0.01),   # 0.7160 (adagrad 0.7117, adam 0.7050)
    "lr_movielens": ("adam_catchup", 0.01),     # 0.7128 (adagrad 0.7120, adam 0.7063)
    # synthetic Criteo at its default 500,000 rows
    "wdl_criteo": ("adagrad", 0.01),       # 0.7968 (adam_catchup 0.7943, adam 0.7938)
    "dfm_criteo": ("adagrad", 0.01),       # 0.7968 (adam_catchup 0.7965, adam 0.7959)
    "dcn_criteo": ("adagrad", 0.01),       # 0.7971 (adam_catchup 0.7942, adam 0.7932)
    "dlrm_criteo": ("adagrad", 0.1),       # 0.7963 (adam_catchup 0.7942, adam 0.7941)
    "dcnv2_criteo": ("adagrad", 0.1),      # 0.7959 (adam 0.7934, adam_catchup 0.7932)
    "lr_criteo": ("adam_catchup", 0.003),  # 0.7969 (adagrad 0.7962, adam 0.7946)
    # synthetic multi-hot Criteo: only Adam at 0.001 was measured (lazy adam 0.7341, adam_catchup
    # 0.7327 at 50,000 rows: "Lazy row-wise Adam against dense Adam")
    "dlrm_criteo_multihot": ("adam", 0.001),
}


@dataclass(frozen=True)
class Model:
    """A name of the command line: an architecture, the synthetic shape it is named for
    ("criteo-multihot"; None: the data given), and the optimizer and learning rate it trains with
    unless told otherwise (RECOMMENDED)."""
    name: str
    architecture: Architecture
    dataset: str = None
    optimizer: str = UNMEASURED[0]
    learning_rate: float = UNMEASURED[1]

    def refusal(self, fields):
        return self.architecture.refusal(fields)

    def __call__(self, dense_input, sparse_input, y_, fields=None, num_embeddings=None, embedding_size=None,
                 optimizer=None):
        """(loss, prediction, y_, train_op) over `fields` (default: the named dataset's real shape);
        `num_embeddings` overrides their rows (ids drawn in memory)."""
        if fields is None:
            if self.dataset is None:
                raise ValueError(f"model {self.name} is named for no dataset: give it the data's fields")
            fields = shape_fields(self.dataset)
        if num_embeddings is not None:
            fields = fields.with_rows(num_embeddings)
        reason = self.refusal(fields)
        if reason is not None:
            raise ValueError(reason)
        size = {} if embedding_size is None else {"embedding_size": embedding_size}
        return self.architecture.build(dense_input, sparse_input, y_, fields, optimizer=optimizer, **size)


def named(name):
    """The Model of ``<arch>_<dataset>``, or of a bare architecture's name."""
    arch, _, dataset = name.partition("_")
    return Model(name, ARCHITECTURES[arch], dataset.replace("_", "-") or None, *RECOMMENDED.get(name, UNMEASURED))


MODELS = {name: named(name) for name in (*ARCHITECTURES, *NAMED)}
# Every name --model takes: the CTR models and the sequential ones.
REGISTRY = {**MODELS, **SEQUENTIAL}
