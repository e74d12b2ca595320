"""Herald pass: with `herald` (True, or hetu.herald.HeraldOptions), the training inputs of every
worker are the samples the scheduler allocates to it, and the parameter-server tables are read
and updated through a HeraldTable that follows the scheduler's plan (instead of the HET cache
protocol)."""
import sys

from ..dataloader import DataloaderOp
from ..herald import HeraldOptions, Scheduler
from ..ops.embedding import PSEmbeddingLookupOp
from ..rows.herald import HeraldTable
from .bind_cache import cache_capacity, embedding_tables, route_through_caches


def schedule_embeddings(graph):
    options = HeraldOptions.of_executor(graph.config.extra)
    if options is None:
        return graph
    if options.protocol == "herald" and (graph.config.bsp != 0 or graph.config.cache_bound != 0):
        # The plan's pulls read what every worker pushed in the iteration before: without the
        # servers' iteration barrier (bsp 0) a pull may run ahead of another worker's push.
        raise ValueError(f"Herald trains exactly synchronously: it needs bsp=0 and cache_bound=0 "
                         f"(got bsp={graph.config.bsp}, cache_bound={graph.config.cache_bound})")
    tables = embedding_tables(graph)
    if not tables:
        raise ValueError("Herald schedules embedding tables on the parameter server: use comm_mode 'PS' or 'Hybrid'")
    lookups = [n for order in graph.topo.values() for n in order if isinstance(n, PSEmbeddingLookupOp)]
    id_sources = {n.inputs[0].id: n.inputs[0] for n in lookups}
    if len(id_sources) != 1 or not isinstance(next(iter(id_sources.values())), DataloaderOp):
        raise ValueError("Herald needs every embedding lookup to read its ids from one dataloader op "
                         f"(found {len(id_sources)} id sources)")
    sparse_op = next(iter(id_sources.values()))
    sparse_loader = sparse_op.loader("train")
    policy = graph.config.cstable_policy or "lru"
    rows = {r.param.shape[0] for r in tables.values()}
    capacity = cache_capacity(graph.config, max(rows))
    if graph.num_workers == 1:
        print("Herald with one worker: every row is stepped locally and the plan equals the cache alone",
              file=sys.stderr)
    scheduler = Scheduler(sparse_loader.data, sparse_loader.batches, graph.num_workers, graph.rank, sparse_loader.batch_size,
                          capacity, policy, options.lookahead, options.allocator,
                          planner_threads=options.planner_threads, comm=graph.comm, planners=options.planners,
                          table_keys=sparse_op.keys,   # a dynamic table's (bind_dynamic): the planner plans its slots
                          # ids computed per step (a sequence model's negatives): planned as the loader gives them
                          global_rows=sparse_loader.global_rows if sparse_loader.columns is not None else None)
    graph.scheduler = scheduler
    if len(scheduler.host_ranks) > 1 and scheduler.plans_here:
        print(f"Herald: worker {graph.rank} plans for this host's workers "
              f"{', '.join(map(str, scheduler.host_ranks))} on {scheduler.planner_threads} thread(s)", flush=True)
    for loader_op in graph.dataloaders:
        if "train" in loader_op.dataloaders:
            loader_op.dataloaders["train"].set_plan(scheduler)
    if options.protocol == "het":
        # Ablation "allocator only": Herald's allocation, the HET cache protocol (bind_cache).
        return graph
    for i, (pid, remote) in enumerate(sorted(tables.items())):
        _, opt_op, _ = graph.ps_params[pid]
        if graph.config.prefetch and opt_op.optimizer.catches_up:
            raise ValueError("Herald's prefetch is not supported with a catch-up optimizer (adam_catchup): the next "
                             "step's pull would bring rows to this step; drop --prefetch")
        graph.caches[pid] = HeraldTable(remote, scheduler, cache_capacity(graph.config, remote.param.shape[0]),
                                        policy, opt_op.optimizer, primary=(i == 0), prefetch=graph.config.prefetch)
    route_through_caches(graph)
    return graph
