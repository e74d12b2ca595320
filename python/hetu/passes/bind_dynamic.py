"""Dynamic tables (hetu.dynamic): the dataloader that feeds a dynamic table's lookups turns keys
into slots through the table's TableKeys, and the lookups read slots (-1: zeros, no gradient)."""
import os

from ..dataloader import DataloaderOp
from ..dynamic import TableKeys, check_memory
from ..herald.options import HeraldOptions
from ..ops.embedding import EmbeddingLookupOp


def bind_dynamic(graph):
    lookups = [n for order in graph.topo.values() for n in order
               if isinstance(n, EmbeddingLookupOp) and getattr(n.inputs[0], "dynamic", None) is not None]
    if not lookups:
        return graph
    if graph.config.ctx.is_gpu:
        raise ValueError("dynamic tables train on CPU workers: drop --gpu (or the GPU context)")
    if graph.config.cstable_policy is not None and (graph.config.cache_bound != 0 or graph.config.bsp != 0):
        raise ValueError("dynamic tables train exactly synchronously: the HET cache needs --bound 0 and --bsp 0")
    if graph.config.prefetch:
        raise ValueError("dynamic tables: the cache's prefetch is not supported (it would map the next batch's "
                         "keys before the step that admits them)")
    on_servers = graph.config.comm_mode in ("PS", "Hybrid")
    servers = int(os.environ.get("DMLC_NUM_SERVER", "1")) if on_servers else 1
    feeding = [(op, _feeding_loader(op.inputs[1], op.inputs[0])) for op in lookups]
    _check_memory(graph, feeding, on_servers)
    by_loader = {}
    for op, loader in feeding:
        table = op.inputs[0]
        keys = by_loader.get(loader.id)
        if keys is None:
            keys = by_loader[loader.id] = loader.keys = TableKeys(table.dynamic, table.name, servers)
            graph.dynamic_keys.append(keys)
        elif keys.table != table.dynamic:
            raise ValueError(f"dynamic tables {keys.name} and {table.name} read the same keys by different rules "
                             f"({keys.table} vs {table.dynamic}): give them the same capacity, buckets, "
                             "admission and ttl")
        op.dynamic = keys
        keys.tables.setdefault(table.id, table)
    return graph


def _check_memory(graph, feeding, on_servers):
    """The directories (a replica each, two under Herald, whose planner keeps its own) and, where
    no server holds them, the rows of the dynamic tables fit in this host's memory
    (hetu.dynamic.check_memory)."""
    replicas = 1 if HeraldOptions.of_executor(graph.config.extra) is None else 2
    spaces = {loader.id: op.inputs[0].dynamic for op, loader in feeding}
    tables = {}
    for op, _ in feeding:
        table = op.inputs[0]
        optimizer = graph.row_stepped.get(table.id)
        width = table.shape[1]
        state = optimizer.state_width(width) if optimizer is not None else 0
        tables[table.id] = (table.name, table.dynamic, 4 * (width + state) + 8)
    check_memory(list(spaces.values()) * replicas, [] if on_servers else list(tables.values()))


def _feeding_loader(ids, table):
    """The one DataloaderOp whose batches reach `ids` (through reshapes and slices)."""
    seen, stack, loaders = set(), [ids], []
    while stack:
        node = stack.pop()
        if node.id in seen:
            continue
        seen.add(node.id)
        if isinstance(node, DataloaderOp):
            loaders.append(node)
        else:
            stack.extend(node.inputs)
    if len(loaders) != 1:
        raise ValueError(f"dynamic table {table.name}: its ids must come from one dataloader (its keys), "
                         f"found {len(loaders)}")
    return loaders[0]
