"""The Executor: compiles named subgraphs once (topological order, shape inference, the pass
list of hetu.passes) and runs one step of a subgraph at a time.

Data path of one step: DataloaderOp (next batch) -> ops in topological order -> OptimizerOp
(local update, or the PS / cache / Herald update that a distribution pass bound it to)."""
import time

import numpy as np

from . import _C, checkpoint, cuda
from .context import cpu
from .graph import Variable
from .launch import progress
from .ndarray import NDArray
from .ops.embedding import IndexedSlices
from .parameters import ParameterStore
from .passes import run_passes
from .passes.graph import Graph


class ExecutorConfig:
    """What the passes read. Distributed options are interpreted by the distribution passes."""

    def __init__(self, ctx=None, seed=None, dist_strategy=None, comm_mode=None, cstable_policy=None,
                 cache_bound=0, cache_limit=None, bsp=0, prefetch=False, cuda_graph=False, table_tier=None,
                 table_prefetch=True, **extra):
        self.ctx = ctx or cpu(0)
        self.cuda_graph = bool(cuda_graph)
        self.seed = int(np.random.SeedSequence().entropy % (2**63)) if seed is None else int(seed)
        self.dist_strategy = dist_strategy
        self.comm_mode = comm_mode
        self.cstable_policy = cstable_policy
        self.cache_bound = cache_bound
        self.cache_limit = cache_limit
        self.bsp = bsp
        self.prefetch = prefetch
        self.table_tier = table_tier   # hetu.ps.DiskTier: the servers keep embedding tables on disk
        self.table_prefetch = table_prefetch   # and read the next step's rows ahead where they are known
        self.extra = extra


class RunState:
    """What an op's compute may use besides its inputs: reusable buffers, per-op scratch space,
    persistent state (running statistics), parameter values, optimizer state, a seeded RNG."""

    def __init__(self, executor):
        self.executor = executor
        self.xp = executor.config.ctx.array_module()
        self.training = False
        self.subgraph = None
        self.iteration = 0
        self.scratch = {}
        # () -> (global step, this worker's samples' rows of the data), set by the step's
        # DataloaderOp: what per-sample draws are keyed by (DropoutOp); None without a dataloader.
        self.batch_samples = None
        self._buffers = {}
        # On a GPU: errors kernels record on the device (read after each step), and the device
        # flag that lets this step's optimizer updates go ahead (set by the OptimizerOp).
        self.checks = cuda.DeviceChecks() if self.xp is not np else None
        self.update_guard = None

    def buffer(self, node, shape, dtype):
        """An output array for `node` that is reused by the node's later steps."""
        key = (node.id, tuple(shape), np.dtype(dtype).str)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = self.xp.empty(shape, dtype=dtype)
        return buf

    def persistent(self, node, key, shape, fill):
        return self.executor.params.running(f"{node.name}/{key}", shape, fill)

    def param_value(self, param):
        return self.executor.params.values[param.id]

    def optimizer_state(self, param, optimizer, rowwise):
        return self.executor.params.optimizer_state(param, optimizer, rowwise)

    def rng(self, node):
        return np.random.default_rng([self.executor.config.seed, _C.name_stream(node.name), self.iteration])

    # The RNG streams and the step are all a checkpoint needs to continue: rng() derives the rest.
    def state(self):
        return {"seed": self.executor.config.seed, "iteration": self.iteration}

    def restore(self, state):
        self.iteration = state["iteration"]


class Executor:
    def __init__(self, eval_node_dict, ctx=None, seed=None, **options):
        if not isinstance(eval_node_dict, dict):
            eval_node_dict = {"default": list(eval_node_dict)}
        self.config = ExecutorConfig(ctx=ctx, seed=seed, **options)
        graph = Graph(eval_node_dict, self.config)
        # Names identify parameters in initialisation, checkpoints and on the servers, which the
        # passes create tables on: check them first.
        _check_unique_names(graph.parameters)
        self.graph = run_passes(graph)
        self.state = RunState(self)
        self.device_step = None
        if self.config.ctx.is_gpu:
            from .device_step import DeviceStep
            self.device_step = DeviceStep(self.config.cuda_graph)
        elif self.config.cuda_graph:
            raise ValueError("cuda_graph=True needs a GPU context (ctx=ht.gpu(i))")
        self.params = ParameterStore(self.graph, self.config.seed, self.state.xp)
        progress.watch()   # under the launcher's --stall-timeout: this worker's steps are watched

    # --- running -------------------------------------------------------------------------------
    def run(self, name="default", feed_dict=None, convert_to_numpy_ret_vals=False, eval_node_list=None,
            training=None):
        """One step of subgraph `name`. Training mode (dropout active, batch statistics) is on
        for subgraphs with an optimizer unless `training` says otherwise."""
        if name not in self.graph.topo:
            raise KeyError(f"no subgraph {name!r}; this executor has {sorted(self.graph.topo)}")
        state = self.state
        state.subgraph = name
        state.training = self.graph.is_training(name) if training is None else training
        if not state.training:
            self.flush()
        feeds = self._check_feeds(name, feed_dict or {})
        started = time.perf_counter()
        order = self.graph.topo[name]
        if self.device_step is not None:
            vals = self.device_step.run((name, state.training), order, feeds, state, self._compute)
        else:
            vals = dict(feeds)
            for node in order:
                if node.id not in vals:
                    vals[node.id] = self._compute(node, vals, None)
        if state.training:
            self.graph.counters.add(step_seconds=time.perf_counter() - started)
            self.graph.counters.end_iteration(state.iteration)
            state.iteration += 1
        progress.step_done()
        outputs = eval_node_list or self.graph.subgraphs[name]
        return [self._output(vals[n.id], convert_to_numpy_ret_vals) for n in outputs]

    def _compute(self, node, vals, host_vals):
        """One node's value. `host_vals`: host copies of the step's inputs on a GPU, which ops
        that read ids on the host (`host_inputs`, parameter-server lookups) are given."""
        if isinstance(node, Variable):
            if node.is_placeholder:
                raise ValueError(f"placeholder {node.name} of subgraph {self.state.subgraph!r} was not fed")
            return self.params.values[node.id]
        if host_vals and node.host_inputs:
            inputs = [host_vals[x.id] if x.id in host_vals else vals[x.id] for x in node.inputs]
        else:
            inputs = [vals[x.id] for x in node.inputs]
        return node.compute(inputs, self.state)

    def _output(self, value, to_numpy):
        """A copy the caller may keep: the executor reuses its buffers on the next step."""
        if value is None:
            return None
        if isinstance(value, IndexedSlices):
            return IndexedSlices(self._output(value.indices, to_numpy), self._output(value.values, to_numpy),
                                 value.dense_shape)
        if to_numpy:
            return value.get() if hasattr(value, "get") else np.array(value, copy=True)
        return NDArray(self.state.xp.array(value, copy=True), self.config.ctx)

    def _check_feeds(self, name, feed_dict):
        xp = self.state.xp
        feeds = {}
        for node, value in feed_dict.items():
            value = np.asarray(value) if not hasattr(value, "__cuda_array_interface__") else value
            if isinstance(node, Variable):
                want = node.dtype
                if value.dtype.kind != want.kind and not (value.dtype.kind in "iu" and want.kind in "iu"):
                    raise TypeError(f"placeholder {node.name} expects {want} values, was fed {value.dtype}")
                if node.shape is not None and tuple(value.shape[1:]) != tuple(node.shape[1:]):
                    raise ValueError(f"placeholder {node.name} expects shape {node.shape}, was fed {value.shape}")
                value = value.astype(want, copy=False)
            # On a GPU, host values reach the device with the step's other inputs (DeviceStep).
            feeds[node.id] = value if self.device_step is not None else xp.asarray(value)
        return feeds

    def flush(self):
        """Writes every pending cached update to the parameter server (all workers call it at the
        same points: before validation, a checkpoint and the end of training)."""
        lr = self.graph.optimizer_ops[0].optimizer.lr.get(self.graph.optimizer_ops[0].step_count) \
            if self.graph.optimizer_ops else 0.0
        for cache in self.graph.caches.values():
            cache.flush(lr)

    @property
    def counters(self):
        """Embedding transmission counters of this worker (hetu.rows.counters.Counters)."""
        return self.graph.counters

    def get_batch_num(self, name="default"):
        loaders = [d.loader(name) for d in self.graph.dataloaders if name in d.dataloaders]
        if not loaders:
            raise ValueError(f"subgraph {name!r} has no dataloader")
        if any(d.batch_num is None for d in loaders):
            return None   # a stream (hetu.streaming): it has no length; it ends when its data stop
        return min(d.batch_num for d in loaders)

    # --- parameters ----------------------------------------------------------------------------
    def parameters(self):
        """name -> NumPy copy of every parameter (tables on the parameter server are pulled as of
        the last completed step). With a bounded cache, every worker calls flush() first."""
        return self.params.snapshot()

    # --- checkpoints (hetu.checkpoint) ---------------------------------------------------------
    def save(self, directory, run=None, full_every=1):
        """A checkpoint from which load() continues the run exactly: parameters, optimizer state,
        running statistics, the step reached and the batch every dataloader reads next. `run`:
        anything of the caller's (e.g. its flags), returned by checkpoint_info().

        Every worker calls it at the same step. Pending cached updates are flushed first; the
        servers write their shards of the tables, worker 0 the rest, into a new folder beside the
        old one, synced, checksummed and swapped in, so that a save interrupted at any point
        leaves a complete checkpoint to resume from. The servers write on their own hosts: across
        hosts, the folder must be on a shared file system. With `full_every` K > 1, the saves
        between every K-th (full) one are deltas: what changed since the save before. Returns
        what worker 0 wrote ("full" or "delta N"); None on the other workers."""
        return checkpoint.save(self, directory, run, full_every)

    @staticmethod
    def checkpoint_info(directory):
        """The checkpoint's meta.json (step reached, cluster shape, the `run` given to save()), of
        `directory` or, where a save was interrupted while replacing it, of the one before it
        (hetu.checkpoint.locate)."""
        return checkpoint.info(directory)

    def load(self, directory):
        """Continues from a checkpoint of save(), into an executor of the same graph that has not
        trained yet. The cluster may differ in shape: other worker counts with the same global
        batch (every dataloader's workers x batch size), other server counts (each server reads
        the rows it now owns from the saved shards that hold them). Every worker calls it;
        everything is checked before anything is changed, and the servers check that the rows
        they loaded add up to their shards."""
        checkpoint.load(self, directory)

    def resumed_from(self, directory):
        """One line on what load() resumed: the step, and the cluster that wrote the checkpoint
        against this one."""
        return checkpoint.resumed_from(self, directory)

    def num_servers(self):
        if not self.graph.remote:
            return 0
        from . import ps
        return ps.num_servers()

    def barrier(self):
        """Every worker waits for all the others (nothing to wait for in one process)."""
        if self.graph.comm is not None:
            self.graph.comm.barrier()


def _check_unique_names(parameters):
    names = {}
    for p in parameters:
        if names.setdefault(p.name, p) is not p:
            raise ValueError(f"two parameters are named {p.name!r}: names identify parameters in "
                             f"initialisation, save/load and the parameter server")
