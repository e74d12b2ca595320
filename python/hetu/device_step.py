"""One step of a subgraph on a GPU (docs/design.md section 12), for the Executor.

- The step's inputs reach the device without another host copy: dataloader batches are read
  into page-locked memory and each copied to a device buffer of its own; fed values go together
  in one pinned copy. Ops that read ids on the host (parameter-server lookups, `host_inputs`)
  get the host arrays.
- Everything runs on the executor's own stream; kernels record their errors on the device
  (hetu.cuda.DeviceChecks), read once when the step ends.
- With `cuda_graph`, after two eager steps (kernels compiled, buffers and optimizer state
  allocated) each run of consecutive ops that are static on the device (`Op.capturable`: no host
  synchronisation, no host data, fixed shapes) is captured once as a CUDA graph, with its own
  memory pool, and replayed from then on; ops that are not (parameter-server lookups and pushes,
  the optimizer's sort-based sparse sums, dropout's host RNG) run eagerly between the graphs."""
import sys

import numpy as np

from . import cuda
from .dataloader import DataloaderOp
from .graph import Variable
from .ops.embedding import IndexedSlices

WARMUP_STEPS = 2


class DeviceStep:
    def __init__(self, cuda_graph=False):
        cp = cuda.cupy()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.inputs = cuda.HostToDevice()
        self.cuda_graph = bool(cuda_graph)
        self.plans = {}            # ((subgraph, training), batch shapes) -> [node or CapturedRun]
        self.eager_steps = {}      # the same keys -> eager steps run so far
        self.pool = None           # the captured graphs' memory pool
        self.capture_error = None  # why capturing was given up, if it was

    def run(self, key, order, feeds, state, compute):
        """The values of one step: `compute(node, vals, host_vals)` computes one node eagerly."""
        with self.stream:
            state.checks.reset()
            vals, host_vals = self._load_inputs(order, feeds, state)
            # Batches of another shape (a validation split's last, partial one) are a run of their own.
            key = (key, tuple(host_vals[n.id].shape for n in order if isinstance(n, DataloaderOp)))
            plan = self.plans.get(key)
            if plan is not None:
                self._replay(plan, vals, host_vals, compute)
            elif self.cuda_graph and self.capture_error is None and self.eager_steps.get(key, 0) >= WARMUP_STEPS:
                self.plans[key] = self._capture(order, vals, host_vals, compute)
            else:
                for node in order:
                    if node.id not in vals:
                        vals[node.id] = compute(node, vals, host_vals)
                self.eager_steps[key] = self.eager_steps.get(key, 0) + 1
            state.checks.raise_if_any()
            self.stream.synchronize()
        return vals

    def _load_inputs(self, order, feeds, state):
        """Dataloader batches (read into page-locked memory, each copied to its own device buffer
        without waiting) and fed values (together in one pinned copy): the host arrays and their
        device copies."""
        host_vals, fed = {}, {}
        vals = {node_id: value for node_id, value in feeds.items() if cuda.is_device_array(value)}
        for node in order:
            if isinstance(node, DataloaderOp):
                loader = node.loader(state.subgraph)
                if loader.host_allocator is None:
                    loader.set_host_allocator(cuda.pinned_array)
                batch = host_vals[node.id] = node.compute([], state)
                device = vals[node.id] = state.buffer(node, batch.shape, batch.dtype)
                device.set(batch, stream=self.stream)
            elif node.id in feeds and not cuda.is_device_array(feeds[node.id]):
                fed[node.id] = host_vals[node.id] = np.ascontiguousarray(feeds[node.id])
        for node_id, device in zip(fed, self.inputs.send(list(fed.values()))):
            vals[node_id] = device
        return vals, host_vals

    # --- CUDA graphs ------------------------------------------------------------------------------
    def _capture(self, order, vals, host_vals, compute):
        """Runs this step, capturing each run of capturable ops; returns the plan to replay (None
        if a run could not be captured: the step is then finished eagerly, and so are the next)."""
        cp = cuda.cupy()
        if self.pool is None:
            self.pool = cp.cuda.MemoryPool()
        plan, run = [], []

        def close():
            if run:
                captured = self._capture_run(list(run), vals, host_vals, compute)
                plan.extend([captured] if captured is not None else run)
                run.clear()
        for node in order:
            if node.id in vals:
                continue
            if isinstance(node, Variable):
                vals[node.id] = compute(node, vals, host_vals)
                plan.append(node)
            elif getattr(node, "capturable", True) and self.capture_error is None:
                run.append(node)
            else:
                close()
                vals[node.id] = compute(node, vals, host_vals)
                plan.append(node)
        close()
        return None if self.capture_error is not None else plan

    def _capture_run(self, nodes, vals, host_vals, compute):
        """A CapturedRun of `nodes`, launched once for this step; or, where capturing fails, the
        nodes computed eagerly and None (kernels recorded in a capture have not run)."""
        cp = cuda.cupy()
        inside = {n.id for n in nodes}
        outside = {x.id for n in nodes for x in n.inputs if x.id not in inside}
        self.stream.begin_capture()
        try:
            with cp.cuda.using_allocator(self.pool.malloc):
                for node in nodes:
                    vals[node.id] = compute(node, vals, host_vals)
            graph = self.stream.end_capture()
        except Exception as e:   # an op that is not static after all: this executor runs eagerly
            _end_capture_quietly(self.stream)
            self.capture_error = f"{type(e).__name__}: {e}"
            print(f"hetu: --cuda-graph: capturing {nodes[0].name}..{nodes[-1].name} failed ({self.capture_error}); "
                  f"running eagerly", file=sys.stderr)
            for node in nodes:
                vals[node.id] = compute(node, vals, host_vals)
            return None
        graph.launch(self.stream)
        return CapturedRun(nodes, graph, {i: vals[i] for i in outside}, {n.id: vals[n.id] for n in nodes})

    def _replay(self, plan, vals, host_vals, compute):
        for item in plan:
            if isinstance(item, CapturedRun):
                item.replay(vals, self.stream)
            elif item.id not in vals:
                vals[item.id] = compute(item, vals, host_vals)


class CapturedRun:
    """A run of ops captured as one CUDA graph. The graph reads its inputs at the addresses they
    had when it was captured: an input computed outside it that comes at another address is
    copied there first (on the device)."""

    def __init__(self, nodes, graph, inputs, outputs):
        self.nodes, self.graph, self.inputs, self.outputs = nodes, graph, inputs, outputs

    def replay(self, vals, stream):
        for node_id, captured in self.inputs.items():
            _refresh(captured, vals[node_id])
        self.graph.launch(stream)
        vals.update(self.outputs)


def _refresh(captured, value):
    if value is captured or value is None:
        return
    if isinstance(captured, IndexedSlices):
        _refresh(captured.indices, value.indices)
        _refresh(captured.values, value.values)
        return
    if captured.data.ptr == value.data.ptr and captured.strides == value.strides:
        return
    if captured.shape != value.shape:
        raise ValueError(f"a captured CUDA graph was recorded with an input of shape {captured.shape}, "
                         f"this step gives {value.shape}: shapes must not change under --cuda-graph")
    captured[...] = value


def _end_capture_quietly(stream):
    try:
        stream.end_capture()
    except Exception:   # the capture was already invalidated: the error being raised says why
        pass
