"""Avazu CTR ``train`` CSV: id, click, then 22 categorical columns (hour kept as a field)."""
from .tabular import TableLayout, prepare_table

COLUMNS = ("id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category",
           "app_id", "app_domain", "app_category", "device_id", "device_ip", "device_model",
           "device_type", "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20",
           "C21")
FIELD_NAMES = COLUMNS[2:]
NUM_FIELDS = len(FIELD_NAMES)
# per-field distinct values of the full 40,428,967-row file; they sum to 9,449,445.
FIELD_SIZES = (240, 7, 7, 4737, 7745, 26, 8552, 559, 36, 2686408, 6729486, 8251, 5, 4, 2626, 8,
               9, 435, 4, 68, 172, 60)
NUM_ROWS = 40_428_967

LAYOUT = TableLayout(
    name="avazu",
    delimiter=",",
    num_columns=len(COLUMNS),
    label_column=1,
    dense_columns=(),
    categorical_columns=tuple(range(2, len(COLUMNS))),
    field_names=FIELD_NAMES,
    header=COLUMNS,
)


def prepare_avazu(input_path, output_dir, *, rows=None, min_count=1, skip_bad_lines=False,
                  val_fraction=0.1, shuffle_seed=None, overwrite=False, progress=True,
                  chunk_bytes=1 << 24, log=None, ids="indexed"):
    """Encode the Avazu ``train`` CSV (with its header row) into a dataset folder.

    The ``id`` column is dropped, ``click`` is the label, the other 22 columns are categorical
    fields (``hour``, YYMMDDHH, included as is). No dense features: dense.npy is [N, 0]."""
    return prepare_table(LAYOUT, input_path, output_dir, rows=rows, min_count=min_count,
                         skip_bad_lines=skip_bad_lines, val_fraction=val_fraction,
                         shuffle_seed=shuffle_seed, chunk_bytes=chunk_bytes,
                         overwrite=overwrite, progress=progress, log=log, ids=ids)
