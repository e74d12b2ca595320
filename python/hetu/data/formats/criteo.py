"""Criteo Kaggle display-advertising ``train.txt``: label, 13 integer and 26 categorical (hex)
columns, tab separated, empty = missing."""
from .tabular import TableLayout, prepare_table

NUM_DENSE = 13
NUM_FIELDS = 26
DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
FIELD_NAMES = tuple(f"C{i}" for i in range(1, NUM_FIELDS + 1))
# per-field distinct values of the full 45,840,617-row file (docs/design.md section 9).
FIELD_SIZES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
               27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
NUM_ROWS = 45_840_617

LAYOUT = TableLayout(
    name="criteo",
    delimiter="\t",
    num_columns=1 + NUM_DENSE + NUM_FIELDS,
    label_column=0,
    dense_columns=tuple(range(1, 1 + NUM_DENSE)),
    categorical_columns=tuple(range(1 + NUM_DENSE, 1 + NUM_DENSE + NUM_FIELDS)),
    field_names=FIELD_NAMES,
    dense_names=DENSE_NAMES,
)


def prepare_criteo(input_path, output_dir, *, rows=None, min_count=1, skip_bad_lines=False,
                   val_fraction=0.1, shuffle_seed=None, overwrite=False, progress=True,
                   chunk_bytes=1 << 24, log=None, ids="indexed"):
    """Encode Criteo ``train.txt`` into a dataset folder.

    Categorical values seen fewer than ``min_count`` times, and missing ones, share local id 0 of
    their field. File order is kept unless ``shuffle_seed`` is given; the file is in time order,
    so by default the validation part (the last ``val_fraction`` of rows) is the most recent
    traffic, which is the usual way Criteo is evaluated."""
    return prepare_table(LAYOUT, input_path, output_dir, rows=rows, min_count=min_count,
                         skip_bad_lines=skip_bad_lines, val_fraction=val_fraction,
                         shuffle_seed=shuffle_seed, chunk_bytes=chunk_bytes,
                         overwrite=overwrite, progress=progress, log=log, ids=ids)
