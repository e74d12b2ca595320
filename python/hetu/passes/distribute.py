"""Distribution pass: binds each trainable parameter to its aggregation (docs/design.md section 4).

- every dataloader reads this worker's slice of each global batch;
- every loss gradient is scaled by 1/W, so summing the workers' gradients gives the gradient of
  the mean loss over the global batch;
- AllReduce parameters get an AllReduceUpdater; parameters on the parameter server are bound
  by the PS pass that follows."""
from ..autodiff import GradientSeedOp
from ..dist import strategy_from_config
from ..dist.comm import MPICommunicator
from ..updaters import AllReduceUpdater


def distribute(graph):
    strategy = strategy_from_config(graph.config)
    graph.strategy = strategy
    if strategy is None:
        return graph
    comm = MPICommunicator()
    graph.comm, graph.rank, graph.num_workers = comm, comm.rank, comm.size
    if graph.config.ctx.is_gpu:
        comm.use_gpu(graph.config.ctx.device_id)   # NCCL, or through host memory where GPUs are shared
    for loader_op in graph.dataloaders:
        for loader in loader_op.dataloaders.values():
            loader.set_worker(comm.rank, comm.size)
    for order in graph.topo.values():
        for node in order:
            if isinstance(node, GradientSeedOp):
                node.scale = 1.0 / comm.size
    for opt_op in graph.optimizer_ops:
        for param, grad in zip(opt_op.params, opt_op.inputs[1:]):
            sparse = getattr(grad, "produces_sparse", False)
            on_ps = strategy.sparse_on_ps() if sparse else strategy.dense_on_ps()
            if not on_ps:
                opt_op.updaters[param.id] = AllReduceUpdater(comm, opt_op.optimizer, graph.counters)
            else:
                graph.ps_params.setdefault(param.id, (param, opt_op, sparse))
    return graph
