"""The parameters an executor holds itself: values of local parameters (and the local copies of
dense parameters on the servers), their optimizer state, and ops' running statistics. Tables on
the servers are theirs (hetu.rows.servers.RemoteTable)."""
import numpy as np

from . import _C, cuda


class ParameterStore:
    def __init__(self, graph, seed, xp):
        self.graph, self.seed, self.xp = graph, seed, xp
        self.values = {}          # parameter id -> array
        self.opt_states = {}      # parameter id -> (state, steps)
        self.persistent = {}      # "op/key" -> array (batch norm running statistics)
        self._initialise()

    def _initialise(self):
        """Local parameters from their initializers (or values); parameters on the parameter
        server are created there by bind_ps, and only dense ones get a local copy."""
        remote = self.graph.remote
        for p in self.graph.parameters:
            if p.id in remote:
                if remote[p.id].dense:
                    self.values[p.id] = self.xp.asarray(np.array(remote[p.id].fetch(), np.float32).reshape(p.shape))
                continue
            if p.value is not None:
                value = np.array(p.value, dtype=np.float32)
            else:
                value = p.initializer.value(self.seed, _C.name_stream(p.name))
            if p.id in self.graph.row_stepped:   # an embedding table: rounded to its rows' type
                self.graph.row_stepped[p.id].round_rows(value)
            self.values[p.id] = value if self.xp is np else self.xp.asarray(value)

    def optimizer_state(self, param, optimizer, rowwise):
        """(state, step counts) of a parameter; row-wise for tables updated by sparse gradients."""
        entry = self.opt_states.get(param.id)
        if entry is None:
            value, xp = self.values[param.id], self.xp
            if rowwise:
                state = xp.zeros((value.shape[0], optimizer.state_width(value.shape[1])), dtype=np.float32)
                steps = xp.zeros(value.shape[0], dtype=np.int64)
            else:
                state = xp.zeros(optimizer.state_width(value.size, dense=True), dtype=np.float32)
                steps = xp.zeros(1, dtype=np.int64)
            entry = self.opt_states[param.id] = (state, steps)
        return entry

    def running(self, full, shape, fill):
        """The running statistic `full` ("op/key"), created as `fill` on first use."""
        if full not in self.persistent:
            self.persistent[full] = self.xp.full(shape, fill, dtype=np.float32)
        return self.persistent[full]

    def snapshot(self):
        """name -> NumPy copy of every parameter (tables on the parameter server are pulled as of
        the last completed step). A catch-up optimizer's local tables are caught up first, every
        row, so they read as dense Adam leaves them."""
        remote = self.graph.remote
        for p in self.graph.parameters:
            op = self.graph.catching_up.get(p.id)
            if op is not None and p.id not in remote and not cuda.is_device_array(self.values[p.id]):
                state, steps = self.optimizer_state(p, op.optimizer, rowwise=True)
                op.optimizer.catch_up(self.values[p.id], state, steps, np.arange(p.shape[0]), op.step_count)
        return {p.name: np.asarray(remote[p.id].fetch()).reshape(p.shape) if p.id in remote
                else np.array(cuda.to_host(self.values[p.id]), copy=True) for p in self.graph.parameters}

    # --- checkpoints (hetu.checkpoint): the arrays of arrays.npz ----------------------------------
    def state(self):
        arrays = {}
        for p in self.graph.parameters:
            if p.id in self.graph.remote:
                continue
            arrays[f"param/{p.name}"] = cuda.to_host(self.values[p.id])
            if p.id in self.opt_states:
                state, steps = self.opt_states[p.id]
                arrays[f"optstate/{p.name}"] = cuda.to_host(state)
                arrays[f"optsteps/{p.name}"] = cuda.to_host(steps)
        for key, value in self.persistent.items():
            arrays[f"persistent/{key}"] = cuda.to_host(value)
        return arrays

    def check(self, arrays, where):
        """That `arrays` hold every local parameter, in the graph's shapes."""
        for p in self.graph.parameters:
            if p.id in self.graph.remote:
                continue
            key = f"param/{p.name}"
            if key not in arrays:
                raise KeyError(f"{where} has no parameter {p.name}")
            if arrays[key].shape != self.values[p.id].shape:
                raise ValueError(f"{where}: {p.name} has shape {arrays[key].shape}, "
                                 f"the graph expects {self.values[p.id].shape}")

    def restore(self, arrays):
        """From state()'s arrays; the local copies of dense parameters on the servers from the
        servers (their tables restored first)."""
        xp, remote = self.xp, self.graph.remote
        for p in self.graph.parameters:
            if p.id in remote:
                if p.id in self.values:
                    self.values[p.id][...] = xp.asarray(np.asarray(remote[p.id].fetch()).reshape(p.shape))
                continue
            self.values[p.id][...] = xp.asarray(arrays[f"param/{p.name}"])
            if f"optstate/{p.name}" in arrays:
                self.opt_states[p.id] = (xp.array(arrays[f"optstate/{p.name}"]), xp.array(arrays[f"optsteps/{p.name}"]))
        for key, value in arrays.items():
            if key.startswith("persistent/"):
                self.persistent[key[len("persistent/"):]] = xp.asarray(value)
