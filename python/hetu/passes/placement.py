"""Device placement: nodes without a context run on the executor's."""


def place_on_device(graph):
    for order in graph.topo.values():
        for node in order:
            if node.ctx is None:
                node.ctx = graph.config.ctx
    return graph
