"""Embedding-cache binding (HET, docs/design.md section 6): with a cache policy set, every embedding
table on the parameter server is read and updated through a per-worker cache of
`cache_limit_ratio` x rows (or `cache_limit` rows) with staleness bound `cache_bound`."""
import math

from ..cache import CachedTable
from ..dataloader import DataloaderOp
from ..dist.ps import PSEmbeddingLookupOp, RemoteTable, route_through_caches


def cache_capacity(config, rows):
    if config.cache_limit is not None:
        return int(config.cache_limit)
    ratio = config.extra.get("cache_limit_ratio", 0.1)
    if not 0 < ratio <= 1:
        raise ValueError(f"cache_limit_ratio must be in (0, 1], got {ratio}")
    return max(1, math.ceil(ratio * rows))


def bind_cache(graph):
    policy = graph.config.cstable_policy
    if policy is None or graph.caches:
        return graph
    if not any(isinstance(r, RemoteTable) for r in graph.remote.values()):
        raise ValueError(f"cstable_policy={policy!r} caches embedding tables on the parameter server: "
                         f"use comm_mode 'PS' or 'Hybrid'")
    for pid, remote in graph.remote.items():
        if not isinstance(remote, RemoteTable):
            continue
        _, opt_op, _ = graph.ps_params[pid]
        graph.caches[pid] = CachedTable(remote, policy, cache_capacity(graph.config, remote.param.shape[0]),
                                        graph.config.cache_bound, opt_op.optimizer, graph.counters)
    route_through_caches(graph)
    if graph.config.prefetch:
        _prefetch_from_dataloaders(graph)
    return graph


def _prefetch_from_dataloaders(graph):
    """A cache whose table is read by exactly one lookup, fed straight by a dataloader in the
    one training subgraph, prefetches that loader's next batch (CachedTable: Prefetch)."""
    lookups = {}
    for name, order in graph.topo.items():
        for node in order:
            if isinstance(node, PSEmbeddingLookupOp) and isinstance(node.source, CachedTable):
                lookups.setdefault(node.source, set()).add((name, node))
    for cache, uses in lookups.items():
        training = [(name, node) for name, node in uses if graph.is_training(name)]
        if len(training) != 1 or len({node for _, node in uses}) != 1:
            continue
        name, node = training[0]
        if isinstance(node.inputs[0], DataloaderOp):
            cache.next_ids = node.inputs[0].loader(name).peek
