"""Data-parallel training across workers: which parameters are summed by AllReduce, which live on
the parameter server. The executor applies a strategy through the `distribute` pass."""

AGGREGATIONS = ("PS", "AllReduce", "Hybrid")


class DataParallel:
    """aggregate: 'PS' (every parameter on the parameter server), 'AllReduce' (every gradient summed
    across workers, embeddings replicated) or 'Hybrid' (embeddings on the PS, dense by AllReduce)."""

    def __init__(self, aggregate="Hybrid"):
        if aggregate not in AGGREGATIONS:
            raise ValueError(f"DataParallel: aggregate must be one of {AGGREGATIONS}, got {aggregate!r}")
        self.aggregate = aggregate

    def dense_on_ps(self):
        return self.aggregate == "PS"

    def sparse_on_ps(self):
        return self.aggregate in ("PS", "Hybrid")

    def __repr__(self):
        return f"DataParallel(aggregate={self.aggregate!r})"


def strategy_from_config(config):
    """The executor's dist_strategy, or one built from Hetu's comm_mode string."""
    if config.dist_strategy is not None:
        return config.dist_strategy
    if config.comm_mode is not None:
        return DataParallel(config.comm_mode)
    return None
