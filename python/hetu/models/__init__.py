"""CTR models: one function per architecture (wdl, dfm, dcn, ncf, dlrm, dcnv2, and lr: the logistic
regression they are measured against), each taking its fields, their slots and the dense width
from the data (hetu.data.Fields: a dataset's ``meta.fields``), and the names the command lines
use. A bare architecture name trains on the data given; ``<arch>_<dataset>`` is the architecture
on the dataset it is named for (its synthetic shape, e.g. ``dlrm_criteo_multihot``: MLPerf's
multi-hot Criteo), whose real shape it takes when it is given no data."""
from dataclasses import dataclass

from hetu.data import shape_fields

from .common import Architecture
from .dcn import DCN
from .dcnv2 import DCNV2
from .dfm import DFM
from .dlrm import DLRM
from .lr import LR
from .ncf import NCF
from .wdl import WDL

ARCHITECTURES = {a.name: a for a in (WDL, DFM, DCN, NCF, DLRM, DCNV2, LR)}
# the names of README, docs, benches and tests: <arch>_<dataset>, the dataset "_" for the shape's "-"
NAMED = ("wdl_criteo", "wdl_avazu", "dfm_criteo", "dfm_avazu", "dcn_criteo", "dcn_avazu", "ncf_movielens",
         "dlrm_criteo", "dcnv2_criteo", "dlrm_movielens", "dlrm_criteo_multihot", "dcnv2_criteo_multihot",
         "lr_criteo", "lr_movielens", "lr_criteo_multihot")


@dataclass(frozen=True)
class Model:
    """A name of the command line: an architecture, and the synthetic shape it is named for
    ("criteo-multihot"; None: the data given)."""
    name: str
    architecture: Architecture
    dataset: str = None

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
    """The Model of ``<arch>_<dataset>``."""
    arch, _, dataset = name.partition("_")
    return Model(name, ARCHITECTURES[arch], dataset.replace("_", "-"))


MODELS = {**{name: Model(name, a) for name, a in ARCHITECTURES.items()}, **{name: named(name) for name in NAMED}}
