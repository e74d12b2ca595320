"""How several runs' figures are quoted: their median, and the range they spanned."""
import statistics


def median_range(values):
    """(median, least, greatest) of `values`."""
    return statistics.median(values), min(values), max(values)
