"""The object that passes take and return: the executor's subgraphs and what compiling found."""
from ..cache.counters import Counters
from ..dataloader import DataloaderOp
from ..graph import Variable, topo_sort
from ..optim import OptimizerOp


class Graph:
    def __init__(self, subgraphs, config):
        self.subgraphs = {name: list(nodes) for name, nodes in subgraphs.items()}
        self.config = config
        self.ps_params = {}   # param id -> (param, optimizer op, sparse): bound to the parameter server
        self.remote = {}      # param id -> RemoteTable / RemoteDense (bind_ps)
        self.caches = {}      # param id -> CachedTable (bind_cache)
        self.counters = Counters()
        self.refresh()

    def refresh(self):
        """Recomputes the derived views after a pass changed the nodes."""
        self.topo = {name: topo_sort(nodes) for name, nodes in self.subgraphs.items()}
        seen, self.parameters, self.placeholders, self.dataloaders, self.optimizer_ops = set(), [], [], [], []
        for order in self.topo.values():
            for node in order:
                if node.id in seen:
                    continue
                seen.add(node.id)
                if isinstance(node, Variable):
                    (self.parameters if node.is_parameter else self.placeholders).append(node)
                elif isinstance(node, DataloaderOp):
                    self.dataloaders.append(node)
                elif isinstance(node, OptimizerOp):
                    self.optimizer_ops.append(node)
        # Tables on the parameter server stay parameters of the graph after their lookups were
        # rewritten to pulls.
        for param, _, _ in self.ps_params.values():
            if param.id not in seen:
                seen.add(param.id)
                self.parameters.append(param)
        return self

    def is_training(self, name):
        return any(isinstance(n, OptimizerOp) for n in self.topo[name])

    def __str__(self):
        lines = []
        for name, order in self.topo.items():
            lines.append(f"subgraph {name}:")
            lines.extend(f"  {n!r}" for n in order)
        return "\n".join(lines)
