"""The object that passes take and return: the executor's subgraphs and what compiling found."""
from ..dataloader import DataloaderOp
from ..graph import Variable, topo_sort
from ..optim import OptimizerOp
from ..rows.counters import Counters


class Graph:
    def __init__(self, subgraphs, config):
        self.subgraphs = {name: list(nodes) for name, nodes in subgraphs.items()}
        self.config = config
        self.counters = Counters()   # this worker's embedding transmissions and step times
        # What the passes find and bind, all declared here (the pass that sets each in brackets).
        self.shapes = {}          # subgraph -> node id -> static shape or None (check_shapes)
        self.strategy = None      # the DataParallel strategy; None in one process (distribute)
        self.comm = None          # MPICommunicator between the workers; None in one process (distribute)
        self.rank, self.num_workers = 0, 1   # this worker among the job's (distribute)
        self.ps_params = {}       # param id -> (param, optimizer op, sparse): on the servers (distribute)
        self.remote = {}          # param id -> RemoteTable (bind_ps)
        self.caches = {}          # param id -> the RowSource in front of its RemoteTable (bind_cache, Herald)
        self.dynamic_keys = []    # hetu.dynamic.TableKeys of the dynamic tables (bind_dynamic)
        self.scheduler = None     # Herald's Scheduler (schedule_embeddings)
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
        # Embedding tables (stepped row by row) -> their optimizer, which rounds them to their rows' type.
        self.row_stepped = {p.id: op.optimizer for op in self.optimizer_ops
                            for p, g in zip(op.params, op.inputs[1:]) if getattr(g, "produces_sparse", False)}
        # Tables whose rows catch up (hetu.optim: adam_catchup) -> the OptimizerOp stepping them,
        # whose step count is the step a read brings a row to.
        self.catching_up = {p.id: op for op in self.optimizer_ops
                            for p, g in zip(op.params, op.inputs[1:])
                            if getattr(g, "produces_sparse", False) and op.optimizer.catches_up}
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
