"""Embedding-cache binding (HET, docs/design.md section 6): with a cache policy set, every embedding
table on the parameter server is read and updated through a per-worker cache of
`cache_limit_ratio` x rows (or `cache_limit` rows) with staleness bound `cache_bound`."""
import math

from ..ops.embedding import PSEmbeddingLookupOp
from ..rows.het import CachedTable
from ..updaters import PSSparseUpdater
from .bind_ps import training_feeds


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
    tables = embedding_tables(graph)
    if not tables:
        raise ValueError(f"cstable_policy={policy!r} caches embedding tables on the parameter server: "
                         f"use comm_mode 'PS' or 'Hybrid'")
    for pid, remote in tables.items():
        _, opt_op, _ = graph.ps_params[pid]
        graph.caches[pid] = CachedTable(remote, policy, cache_capacity(graph.config, remote.param.shape[0]),
                                        graph.config.cache_bound, opt_op.optimizer)
    route_through_caches(graph)
    if graph.config.prefetch:
        if any(graph.ps_params[pid][1].optimizer.catches_up for pid in tables):
            raise ValueError("the cache's prefetch is not supported with a catch-up optimizer (adam_catchup): "
                             "the next step's pull would bring rows to this step; drop --prefetch")
        _prefetch_from_dataloaders(graph)
    return graph


def embedding_tables(graph):
    """param id -> RemoteTable of every embedding table on the servers (bind_ps)."""
    return {pid: remote for pid, remote in graph.remote.items() if not remote.dense}


def route_through_caches(graph):
    """Points every PS lookup and sparse updater at its table's worker-side cache (graph.caches:
    param id -> CachedTable or HeraldTable), where the table has one."""
    for order in graph.topo.values():
        for node in order:
            if isinstance(node, PSEmbeddingLookupOp) and node.source.param.id in graph.caches:
                node.source = graph.caches[node.source.param.id]
    for opt_op in graph.optimizer_ops:
        for updater in opt_op.updaters.values():
            if isinstance(updater, PSSparseUpdater) and updater.source.param.id in graph.caches:
                updater.source = graph.caches[updater.source.param.id]


def _prefetch_from_dataloaders(graph):
    """A cache whose table is read by exactly one lookup, fed straight by a dataloader in the
    one training subgraph, prefetches that loader's next batch (CachedTable: Prefetch)."""
    for cache, (name, node) in training_feeds(graph, CachedTable).items():
        cache.next_ids = node.inputs[0].loader(name).peek