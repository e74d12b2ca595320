"""The Executor: compiles named subgraphs once (topological order, shape inference, the pass
list of hetu.passes) and runs one step of a subgraph at a time.

Data path of one step: DataloaderOp (next batch) -> ops in topological order -> OptimizerOp
(local update, or the PS / cache / Herald update that a distribution pass bound it to)."""
import os
import shutil
import time

import numpy as np

from . import _C, checkpoint, cuda
from .context import cpu
from .dist.ps import RemoteDense
from .graph import Variable
from .ndarray import NDArray
from .ops.embedding import IndexedSlices
from .passes import run_passes
from .passes.graph import Graph


class ExecutorConfig:
    """What the passes read. Distributed options are interpreted by the distribution passes."""

    def __init__(self, ctx=None, seed=None, dist_strategy=None, comm_mode=None, cstable_policy=None,
                 cache_bound=0, cache_limit=None, bsp=0, prefetch=False, cuda_graph=False, **extra):
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
        store = self.executor.persistent
        full = f"{node.name}/{key}"
        if full not in store:
            store[full] = self.xp.full(shape, fill, dtype=np.float32)
        return store[full]

    def param_value(self, param):
        return self.executor.values[param.id]

    def optimizer_state(self, param, optimizer, rowwise):
        return self.executor.optimizer_state(param, optimizer, rowwise)

    def rng(self, node):
        return np.random.default_rng([self.executor.config.seed, _C.name_stream(node.name), self.iteration])


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
        self.values = {}          # parameter id -> array
        self.opt_states = {}      # parameter id -> (state, steps)
        self.persistent = {}      # "op/key" -> array (batch norm running statistics)
        self._init_parameters()

    # --- set-up --------------------------------------------------------------------------------
    def _init_parameters(self):
        """Local parameters from their initializers (or values); parameters on the parameter
        server are created there by bind_ps, and only dense ones get a local copy."""
        xp = self.state.xp
        remote = self.graph.remote
        for p in self.graph.parameters:
            if p.id in self.values:
                continue
            if p.id in remote:
                if isinstance(remote[p.id], RemoteDense):
                    value = np.array(remote[p.id].fetch(), dtype=np.float32).reshape(p.shape)
                    self.values[p.id] = value if xp is np else xp.asarray(value)
                continue
            if p.value is not None:
                value = np.array(p.value, dtype=np.float32)
            else:
                value = p.initializer.value(self.config.seed, _C.name_stream(p.name))
            self.values[p.id] = value if xp is np else xp.asarray(value)

    def optimizer_state(self, param, optimizer, rowwise):
        """(state, step counts) of a parameter; row-wise for tables updated by sparse gradients."""
        entry = self.opt_states.get(param.id)
        if entry is None:
            value = self.values[param.id]
            xp = self.state.xp
            if rowwise:
                state = xp.zeros((value.shape[0], optimizer.state_width(value.shape[1])), dtype=np.float32)
                steps = xp.zeros(value.shape[0], dtype=np.int64)
            else:
                state = xp.zeros(optimizer.state_width(value.size, dense=True), dtype=np.float32)
                steps = xp.zeros(1, dtype=np.int64)
            entry = self.opt_states[param.id] = (state, steps)
        return entry

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
        outputs = eval_node_list or self.graph.subgraphs[name]
        return [self._output(vals[n.id], convert_to_numpy_ret_vals) for n in outputs]

    def _compute(self, node, vals, host_vals):
        """One node's value. `host_vals`: host copies of the step's inputs on a GPU, which ops
        that read ids on the host (`host_inputs`, parameter-server lookups) are given."""
        if isinstance(node, Variable):
            if node.is_placeholder:
                raise ValueError(f"placeholder {node.name} of subgraph {self.state.subgraph!r} was not fed")
            return self.values[node.id]
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
        """Embedding transmission counters of this worker (hetu.cache.counters.Counters)."""
        return self.graph.counters

    def get_batch_num(self, name="default"):
        loaders = [d.loader(name) for d in self.graph.dataloaders if name in d.dataloaders]
        if not loaders:
            raise ValueError(f"subgraph {name!r} has no dataloader")
        return min(d.batch_num for d in loaders)

    # --- parameters ----------------------------------------------------------------------------
    def parameters(self):
        """name -> NumPy copy of every parameter (tables on the parameter server are pulled as of
        the last completed step). With a bounded cache, every worker calls flush() first."""
        out = {}
        remote = self.graph.remote
        for p in self.graph.parameters:
            if p.id in remote:
                out[p.name] = np.asarray(remote[p.id].fetch()).reshape(p.shape)
            else:
                out[p.name] = np.array(cuda.to_host(self.values[p.id]), copy=True)
        return out

    # --- checkpoints ---------------------------------------------------------------------------
    def save(self, directory, run=None):
        """A checkpoint from which load() continues the run exactly: parameters, optimizer state,
        running statistics, the step reached and the batch every dataloader reads next. `run`:
        anything of the caller's (e.g. its flags), returned by checkpoint_info().

        Every worker calls it at the same step. Pending cached updates are flushed first (a
        collective push); then worker 0 has the servers write their shards of the tables and
        writes the rest itself (local parameters are the same on every worker), into a new folder
        beside the old one, synced, checksummed and swapped in (hetu.checkpoint), so that a save
        interrupted at any point leaves a complete checkpoint to resume from. The servers write on
        their own hosts: across hosts, the folder must be on a shared file system."""
        self.flush()
        self.barrier()   # every worker's pushes are in, so the servers have applied them all
        if self.graph.rank == 0:
            self._write_checkpoint(os.path.abspath(directory), run)
        self.barrier()   # no worker pushes again before the servers have written

    def _write_checkpoint(self, directory, run):
        tmp = checkpoint.new_folder(directory)
        try:
            arrays, clocks = {}, {}
            remote = self.graph.remote
            for p in self.graph.parameters:
                if p.id in remote:
                    # The servers write their shards (values, optimizer state, versions).
                    remote[p.id].save(os.path.join(tmp, "ps"))
                    clocks[p.name] = self._row_source(p.id).state()
                    continue
                arrays[f"param/{p.name}"] = cuda.to_host(self.values[p.id])
                if p.id in self.opt_states:
                    state, steps = self.opt_states[p.id]
                    arrays[f"optstate/{p.name}"] = cuda.to_host(state)
                    arrays[f"optsteps/{p.name}"] = cuda.to_host(steps)
            for key, value in self.persistent.items():
                arrays[f"persistent/{key}"] = cuda.to_host(value)
            np.savez(os.path.join(tmp, "arrays.npz"), **arrays)
            meta = {"seed": self.config.seed, "iteration": self.state.iteration,
                    "optimizer_steps": {op.name: op.step_count for op in self.graph.optimizer_ops},
                    "workers": self.graph.num_workers, "servers": self._num_servers(), "clocks": clocks,
                    "tables": {p.name: list(p.shape) for p in self.graph.parameters if p.id in remote},
                    "loaders": [{name: d.position for name, d in op.dataloaders.items()}
                                for op in self.graph.dataloaders],
                    "global_batches": [{name: d.global_batch for name, d in op.dataloaders.items()}
                                       for op in self.graph.dataloaders],
                    "run": run}
            checkpoint.seal(tmp, meta)
            checkpoint.swap_in(tmp, directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @staticmethod
    def checkpoint_info(directory):
        """The checkpoint's meta.json (step reached, cluster shape, the `run` given to save()), of
        `directory` or, where a save was interrupted while replacing it, of the one before it
        (hetu.checkpoint.locate)."""
        folder, _ = checkpoint.locate(directory)
        if not os.path.exists(os.path.join(folder, "arrays.npz")):
            raise FileNotFoundError(f"{folder} is not a hetu checkpoint (no arrays.npz)")
        return checkpoint.read_meta(folder)

    def load(self, directory):
        """Continues from a checkpoint of save(), into an executor of the same graph that has not
        trained yet. The cluster may differ in shape: other worker counts with the same global
        batch (every dataloader's workers x batch size), other server counts (each server reads
        the rows it now owns from the saved shards that hold them). Every worker calls it;
        everything is checked before anything is changed, and the servers check that the rows
        they loaded add up to their shards."""
        directory, _ = checkpoint.locate(directory)
        meta = self.checkpoint_info(directory)
        # Every file is checked before anything is loaded; the servers' shards by worker 0,
        # the one that has the servers load them.
        checkpoint.verify(directory, meta, only=None if self.graph.rank == 0 else "arrays.npz")
        if self.state.iteration:
            raise RuntimeError(f"load {directory}: this executor has trained {self.state.iteration} steps; "
                               f"load a checkpoint into a new one")
        self._check_checkpoint_shape(directory, meta)
        xp = self.state.xp
        remote = self.graph.remote
        with np.load(os.path.join(directory, "arrays.npz")) as data:
            arrays = {key: data[key] for key in data.files}
        for p in self.graph.parameters:
            if p.id in remote:
                if p.name not in meta.get("clocks", {}):
                    raise KeyError(f"checkpoint {directory} has no parameter {p.name} on the servers")
                continue
            key = f"param/{p.name}"
            if key not in arrays:
                raise KeyError(f"checkpoint {directory} has no parameter {p.name}")
            if arrays[key].shape != self.values[p.id].shape:
                raise ValueError(f"checkpoint {directory}: {p.name} has shape {arrays[key].shape}, "
                                 f"the graph expects {self.values[p.id].shape}")

        if self.graph.rank == 0:
            for p in self.graph.parameters:
                if p.id in remote:
                    remote[p.id].load(os.path.join(directory, "ps"))
        self.barrier()   # every table is loaded before any worker reads one
        for p in self.graph.parameters:
            if p.id in remote:
                # Pushes are tagged with the clock, which the servers' loaded tables continue;
                # the caches start empty (the checkpoint's were flushed to the servers).
                self._row_source(p.id).restore(meta["clocks"][p.name], meta["iteration"])
                if p.id in self.values:
                    self.values[p.id][...] = xp.asarray(np.asarray(remote[p.id].fetch()).reshape(p.shape))
                continue
            self.values[p.id][...] = xp.asarray(arrays[f"param/{p.name}"])
            if f"optstate/{p.name}" in arrays:
                self.opt_states[p.id] = (xp.array(arrays[f"optstate/{p.name}"]), xp.array(arrays[f"optsteps/{p.name}"]))
        for key, value in arrays.items():
            if key.startswith("persistent/"):
                self.persistent[key[len("persistent/"):]] = xp.asarray(value)
        self.state.iteration = meta["iteration"]
        for op in self.graph.optimizer_ops:
            op.step_count = meta["optimizer_steps"].get(op.name, op.step_count)
        for op, positions in zip(self.graph.dataloaders, meta.get("loaders", [])):
            for name, position in positions.items():
                op.dataloaders[name].seek(position)
        # Herald's plans restart with the caches at the step reached.
        if self.graph.scheduler is not None:
            self.graph.scheduler.start_at(self.state.iteration)

    def _row_source(self, param_id):
        """What a parameter on the servers is read through: its cache, else the servers."""
        return self.graph.caches.get(param_id, self.graph.remote[param_id])

    def _check_checkpoint_shape(self, directory, meta):
        """The data path a checkpoint continues must be the one it was written by, with the same
        global batches (DESIGN.md section 4), and its tables the graph's."""
        loaders = meta.get("loaders", [])
        names = [sorted(op.dataloaders) for op in self.graph.dataloaders]
        if loaders and [sorted(p) for p in loaders] != names:
            raise ValueError(f"checkpoint {directory} holds dataloaders {[sorted(p) for p in loaders]}, "
                             f"the graph has {names}")
        workers, saved_batches = meta.get("workers", 1), meta.get("global_batches")
        if workers != self.graph.num_workers and saved_batches is None:
            raise ValueError(f"checkpoint {directory} was written by {workers} worker(s), this run has "
                             f"{self.graph.num_workers}, and it does not record its global batch: the training "
                             f"could differ")
        for op, saved in zip(self.graph.dataloaders, saved_batches or []):
            for name, d in op.dataloaders.items():
                if saved.get(name, d.global_batch) != d.global_batch:
                    raise ValueError(
                        f"checkpoint {directory} was trained with a global batch of {saved[name]} ({workers} "
                        f"worker(s) x {saved[name] // workers}) in dataloader {name!r}, this run's is "
                        f"{d.global_batch} ({d.num_workers} worker(s) x {d.batch_size}): workers x batch size "
                        f"must stay the same, or the training would differ")
        remote = self.graph.remote
        for p in self.graph.parameters:
            saved = meta.get("tables", {}).get(p.name)
            if p.id in remote and saved is not None and tuple(saved) != tuple(p.shape):
                raise ValueError(f"checkpoint {directory}: table {p.name} has shape {tuple(saved)}, the graph's "
                                 f"is {tuple(p.shape)}")

    def resumed_from(self, directory):
        """One line on what load() resumed: the step, and the cluster that wrote the checkpoint
        against this one."""
        meta = self.checkpoint_info(directory)
        tables = len(meta.get("tables", meta.get("clocks", {})))
        return (f"resumed {directory} at step {meta['iteration']}: written by {meta.get('workers', 1)} worker(s) and "
                f"{meta.get('servers', 0)} server(s), continued by {self.graph.num_workers} and "
                f"{self._num_servers()}; every file's sha256 checked"
                + (f", the servers' rows of {tables} table(s) counted as loaded" if tables else ""))

    def _num_servers(self):
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
