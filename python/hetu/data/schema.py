"""What a model reads of a dataset: the fields of meta.json, typed (``DatasetMeta.fields``, and
``synthetic.shape_fields`` for a synthetic shape without its data)."""
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Fields:
    """The categorical fields (names, and the sparse.npy columns each takes: 1 for a single id, k
    for a bag of up to k ids), the rows of the one embedding table they share (each field an id
    range of it), and the width of the dense features (0: none)."""
    names: tuple
    slots: tuple
    num_embeddings: int
    num_dense: int = 0
    bags: tuple = ()   # the multi-hot fields' names
    dynamic: object = None   # hetu.dynamic.DynamicTable: the table takes keys, num_embeddings is its capacity

    def __post_init__(self):
        if len(self.names) != len(self.slots):
            raise ValueError(f"{len(self.names)} field names but {len(self.slots)} slot counts")

    @classmethod
    def from_meta(cls, meta):
        """From a ``DatasetMeta`` (a dataset folder's meta.json)."""
        return cls(tuple(meta.field_names), tuple(meta.field_slots), int(meta.num_embeddings),
                   int(meta.num_dense), tuple(meta.bag_fields))

    @property
    def count(self):
        return len(self.names)

    @property
    def multi_hot(self):
        """True when a field takes more than one column (a model reading one id per field cannot)."""
        return any(k != 1 for k in self.slots)

    def with_dynamic(self, table):
        """The same fields read through a dynamic table (hetu.dynamic.DynamicTable) of its capacity."""
        return replace(self, num_embeddings=int(table.capacity), dynamic=table)

    def with_rows(self, num_embeddings):
        """The same fields over a table of ``num_embeddings`` rows (ids drawn in memory, no meta.json)."""
        return replace(self, num_embeddings=int(num_embeddings))
