"""Parquet files (pyarrow), their columns described by the schema file of ``schema:FILE``
(streams.py): ``parquet:FILE`` as a stream, ``prepare parquet --schema FILE`` as a dataset. A
column is found by its name (the schema's ``delimiter`` and ``header`` do not apply; ``ignore``
columns are not read), and a sample is what the same row written as a line of text gives:

    label        any number (or bool) column; 1 when >= the threshold; a null is an error
    dense        any number column; a null is 0; the schema's transform (NaN and inf are errors,
                 as text's "nan" is a bad line)
    categorical  an integer column (the key of the value's decimal text, as in text) or a string
                 column; a null is the empty value
    bag          a list of integers or strings, or a string column split at the separator; a null
                 or empty list is no value

A file is read whole, once it is complete: feature pipelines write a file under another name and
rename it, and a file still being written has no footer yet, which pyarrow cannot open; such a
file is waited for (the stream names it) and read once it opens.
"""
import numpy as np

from ..keys import hash_values
from ..store import BAG_PADDING
from .streams import ParsedLines, SchemaFormat
from .tabular import dense_transform
from .textio import DataFormatError

BATCH_ROWS = 1 << 16   # rows of a file decoded at a time


def pyarrow_modules():
    import pyarrow   # imported here: only parquet data needs it
    import pyarrow.compute
    import pyarrow.parquet
    return pyarrow, pyarrow.compute, pyarrow.parquet


def finite(numbers, column, path, first_row):
    """``numbers``, or a DataFormatError naming the first that is not finite (as text rejects "nan")."""
    bad = np.flatnonzero(~np.isfinite(numbers))
    if len(bad):
        raise DataFormatError(f"{path}: row {first_row + int(bad[0]) + 1}: column {column.name!r} "
                              f"({column.role}) holds {numbers[bad[0]]}, not a finite number")
    return numbers


class ParquetFormat(SchemaFormat):
    """The schema's columns, read by name from Parquet files, a whole file at a time."""
    whole_files = True

    def open_file(self, path):
        """(the opened pyarrow.parquet.ParquetFile, None), or (None, why) while the file is not
        complete. A complete file whose columns do not fit the schema raises DataFormatError."""
        pa, _, pq = pyarrow_modules()
        try:
            opened = pq.ParquetFile(str(path))
        except (pa.ArrowInvalid, OSError) as error:
            return None, str(error).splitlines()[0] if str(error) else type(error).__name__
        self.check_columns(opened.schema_arrow, path)
        return opened, None

    def check_columns(self, schema, path):
        pa = pyarrow_modules()[0]
        types = pa.types
        number = lambda t: types.is_integer(t) or types.is_floating(t)  # noqa: E731
        text = lambda t: types.is_string(t) or types.is_large_string(t)  # noqa: E731
        expected = {"label": ("a number", lambda t: number(t) or types.is_boolean(t)),
                    "dense": ("a number", number),
                    "categorical": ("an integer or a string", lambda t: types.is_integer(t) or text(t)),
                    "bag": ("a list of integers or strings, or a string",
                            lambda t: text(t) or (types.is_list(t) or types.is_large_list(t)) and
                            (types.is_integer(t.value_type) or text(t.value_type)))}
        for column in self.columns:
            if column.role == "ignore":
                continue
            if column.name not in schema.names:
                raise DataFormatError(f"{path}: no column {column.name!r} ({column.role}); "
                                      f"its columns: {', '.join(schema.names)}")
            kind = schema.field(column.name).type
            what, fits = expected[column.role]
            if not fits(kind):
                raise DataFormatError(f"{path}: column {column.name!r} ({column.role}) is {kind}, expected {what}")

    def file_samples(self, path, start=0, batch_rows=BATCH_ROWS):
        """ParsedLines of a complete file from row ``start``: ``line_index`` each sample's row
        (from ``start``), ``ends`` the rows read after it; raises DataFormatError for a file that
        is not complete."""
        opened, why = self.open_file(path)
        if opened is None:
            raise DataFormatError(f"{path}: not a complete Parquet file ({why})")
        names = [c.name for c in self.columns if c.role != "ignore"]
        row = 0
        for batch in opened.iter_batches(batch_size=batch_rows, columns=names):
            if row + batch.num_rows <= start:
                row += batch.num_rows
                continue
            skip = max(start - row, 0)
            parsed = self.batch_samples(batch.slice(skip), path, row + skip)
            parsed.line_index += row + skip - start
            parsed.ends += row + skip
            row += batch.num_rows
            yield parsed

    def batch_samples(self, batch, path, first_row):
        """ParsedLines of a pyarrow RecordBatch (``ends``: rows from the batch's first, after each)."""
        _, pc, _ = pyarrow_modules()
        n = batch.num_rows
        dense, sparse, labels, at = [], np.full((n, sum(self.fields.slots)), BAG_PADDING, np.int64), None, 0
        for column in self.columns:
            if column.role == "ignore":
                continue
            values = batch.column(column.name)
            if column.role == "label":
                if values.null_count:
                    row = first_row + int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
                    raise DataFormatError(f"{path}: row {row + 1}: column {column.name!r} (label) is null")
                number = finite(values.cast("float64").to_numpy(zero_copy_only=False), column, path, first_row)
                labels = (number >= column.threshold).astype(np.float32)
            elif column.role == "dense":
                number = finite(pc.fill_null(values.cast("float64"), 0.0).to_numpy(zero_copy_only=False),
                                column, path, first_row)
                dense.append(dense_transform(number) if column.transform == "log1p" else number.astype(np.float32))
            elif column.role == "categorical":
                sparse[:, at] = hash_values(column.field, pc.fill_null(values.cast("string"), "").to_pylist())
                at += 1
            else:
                self.bag_keys(column, values, sparse[:, at:at + column.slots], path, first_row)
                at += column.slots
        dense = np.stack(dense, axis=1) if dense else np.zeros((n, 0), np.float32)
        rows = np.arange(n, dtype=np.int64)
        return ParsedLines(dense, sparse, labels, rows, rows + 1)

    def bag_keys(self, column, values, out, path, first_row):
        """Each row's values' keys into ``out`` [n, slots] (padding left where none)."""
        pa, pc, _ = pyarrow_modules()
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            rows = [v.split(column.separator) if v else [] for v in pc.fill_null(values, "").to_pylist()]
        else:
            rows = [[None if x is None else str(x) for x in v] if v else [] for v in values.to_pylist()]
        for i, bag in enumerate(rows):
            if None in bag or "" in bag:
                raise DataFormatError(f"{path}: row {first_row + i + 1}: column {column.name!r} (bag) "
                                      "holds an empty value")
            if len(bag) > column.slots:
                raise DataFormatError(f"{path}: row {first_row + i + 1}: column {column.name!r} (bag) holds "
                                      f"{len(bag)} values, more than its {column.slots} slots")
            if bag:
                out[i, :len(bag)] = hash_values(column.field, bag)
