"""Parameter-server binding: the parameters that the distribution pass placed on the PS are
created on the servers (same initializer, seed and stream as a local run), embedding lookups of
PS tables become sparse pulls, and their updates become pushes tagged with the iteration."""
from ..dataloader import DataloaderOp
from ..ops.embedding import EmbeddingLookupOp, PSEmbeddingLookupOp
from ..rows.plain import PlainRows
from ..rows.servers import RemoteTable, SyncMode, launched_as_ps_worker, start_worker
from ..updaters import PSDenseUpdater, PSSparseUpdater


def bind_ps(graph):
    # A worker of a job with servers joins it even when nothing of its graph is there (e.g.
    # AllReduce with a cluster file that lists servers), so that the scheduler and the servers end
    # when the workers do instead of waiting for them to connect. A graph with parameters there
    # needs such a job: start_worker says how to launch one.
    if graph.ps_params or launched_as_ps_worker():
        start_worker()
    if not graph.ps_params:
        return graph
    import hetu.ps as ps
    client, sync, seed = ps.client(), SyncMode(graph.config.bsp), graph.config.seed
    tables = {}   # param id -> the plain-PS RowSource of an embedding table
    for param, opt_op, sparse in graph.ps_params.values():
        remote = graph.remote[param.id] = RemoteTable(client, param, opt_op.optimizer, seed, sync, graph.counters,
                                                      dense=not sparse, tier=graph.config.table_tier,
                                                      tier_prefetch=graph.config.table_prefetch)
        if sparse:
            if opt_op.optimizer.catches_up:
                remote.steps_taken = lambda op=opt_op: op.step_count
            tables[param.id] = PlainRows(remote)
            opt_op.updaters[param.id] = PSSparseUpdater(tables[param.id])
        else:
            opt_op.updaters[param.id] = PSDenseUpdater(remote)
    _replace_lookups(graph, tables)
    graph.refresh()
    for source, (name, lookup) in training_feeds(graph, PlainRows).items():
        if source.remote.hints:
            source.next_ids = _next_rows(lookup.inputs[0].loader(name), lookup)
    return graph


def training_feeds(graph, source_type):
    """{row source: (subgraph, its lookup)} for the sources of `source_type` that exactly one PS
    lookup reads, in the one training subgraph, fed straight by a dataloader: those whose next
    step's ids are known a step ahead (the dataloader's look-ahead)."""
    lookups = {}
    for name, order in graph.topo.items():
        for node in order:
            if isinstance(node, PSEmbeddingLookupOp) and isinstance(node.source, source_type):
                lookups.setdefault(node.source, set()).add((name, node))
    feeds = {}
    for source, uses in lookups.items():
        training = [(name, node) for name, node in uses if graph.is_training(name)]
        if len(training) != 1 or len({node for _, node in uses}) != 1:
            continue
        name, node = training[0]
        if isinstance(node.inputs[0], DataloaderOp):
            feeds[source] = (name, node)
    return feeds


def _next_rows(loader, lookup):
    """The next step's rows `lookup` reads, or None while a stream does not hold them yet: its ids,
    or for a dynamic table the slots of the keys resident now (a key admitted at that step has no
    row on disk to read ahead; -1 marks it)."""
    def rows():
        ids = loader.peek_ready()
        if ids is None or lookup.dynamic is None:
            return ids
        return lookup.dynamic.lookup(ids)
    return rows


def _replace_lookups(graph, tables):
    """Rewires every consumer of a PS table lookup (or bag) to a PSEmbeddingLookupOp that reads
    the table's rows from `tables`."""
    replacements = {}
    for order in graph.topo.values():
        for node in order:
            if isinstance(node, EmbeddingLookupOp) and node.inputs[0].id in tables:
                lookup = PSEmbeddingLookupOp(node.inputs[1], tables[node.inputs[0].id], bags=node.bags, ctx=node.ctx)
                lookup.dynamic = node.dynamic
                replacements[node.id] = lookup
    if not replacements:
        return
    for order in graph.topo.values():
        for node in order:
            node.inputs = [replacements.get(x.id, x) for x in node.inputs]
    for name, nodes in graph.subgraphs.items():
        graph.subgraphs[name] = [replacements.get(n.id, n) for n in nodes]
