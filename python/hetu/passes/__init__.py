"""Compilation passes. Each is a plain function `graph -> graph` with one job; PASSES lists them
in the order they run, so reading it tells what compilation does."""
from .bind_cache import bind_cache
from .bind_dynamic import bind_dynamic
from .bind_ps import bind_ps
from .distribute import distribute
from .placement import place_on_device
from .schedule_embeddings import schedule_embeddings
from .shapes import check_shapes

PASSES = [
    check_shapes,      # shape and dtype inference where shapes are static: errors name ops and shapes
    distribute,        # worker slices of each global batch, 1/W loss scale, AllReduce updaters
    bind_dynamic,      # dynamic tables: their keys become slots at the dataloader, lookups read slots
    bind_ps,           # PS parameters created on the servers; lookups pull, updates push
    schedule_embeddings,  # Herald: scheduler-allocated inputs, PS tables through plan-driven caches
    bind_cache,        # HET: PS tables read and updated through the worker's cache (if not Herald's)
    place_on_device,   # every node gets the executor's context unless it asked for one
]


def run_passes(graph, passes=None):
    for p in PASSES if passes is None else passes:
        graph = p(graph)
    return graph
