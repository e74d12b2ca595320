"""Collective communication between workers over MPI (mpi4py), for AllReduce aggregation; on
GPUs over NCCL (cupy.cuda.nccl) when every worker has a GPU of its own, and through host memory
and MPI when workers share one (NCCL refuses two ranks on one device)."""
import os
import socket
import sys

import numpy as np

from .. import cuda

_exit_hook_installed = False


def exit_at_once_on_uncaught_exception(MPI):
    """Once MPI is up, a worker that dies of an exception would not exit: at interpreter exit it
    waits in MPI_Finalize for the other ranks, which wait for it in turn (in an AllReduce, or in
    a pull that the servers hold for this worker's push), and the job hangs. So an uncaught
    exception prints its traceback and ends the process at once, skipping MPI_Finalize and the
    exit handlers: mpirun sees a worker fail and stops the others, and the launcher then stops
    the scheduler and servers (without the launcher, they notice the missing heartbeats)."""
    global _exit_hook_installed
    if _exit_hook_installed or MPI.COMM_WORLD.Get_size() < 2:
        return
    previous = sys.excepthook

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        _end_now(1)
    sys.excepthook = hook
    _exit_hook_installed = True


def exit_at_once_if_mpi_started(stop):
    """The same for a SystemExit, which never reaches sys.excepthook: with MPI up and a non-zero
    status, prints its message and ends the process now; otherwise returns, for the caller to
    re-raise. For entry points that may stop on their own after MPI started (a check that fails
    on one worker only, say, because its host's copy of the data differs)."""
    if not _exit_hook_installed or stop.code in (None, 0):
        return
    if isinstance(stop.code, int):
        code = stop.code
    else:
        print(stop.code, file=sys.stderr)
        code = 1
    _end_now(code)


def _end_now(code):
    """Ends the process with `code`, skipping MPI_Finalize and the exit handlers."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class MPICommunicator:
    def __init__(self):
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise RuntimeError("AllReduce aggregation needs mpi4py (pip install mpi4py) and an MPI launch "
                               "(python/runner.py starts workers through mpirun)") from e
        exit_at_once_on_uncaught_exception(MPI)
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.nccl = None

    def use_gpu(self, device_id):
        """Every worker calls it once with its GPU: NCCL if no two workers share a device, else
        the device arrays are summed through host memory. Returns which ("nccl" or "host")."""
        devices = self.comm.allgather((socket.gethostname(), int(device_id)))
        if len(set(devices)) < len(devices):
            return "host"
        from cupy.cuda import nccl
        uid = self.comm.bcast(nccl.get_unique_id() if self.rank == 0 else None, root=0)
        self.nccl = nccl.NcclCommunicator(self.size, uid, self.rank)
        return "nccl"

    def allreduce_sum(self, array):
        """Sum over workers, in place (device arrays stay on the device)."""
        if cuda.is_device_array(array):
            return self._allreduce_device(array)
        buf = np.ascontiguousarray(array, dtype=np.float32)
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        return buf

    def _allreduce_device(self, array):
        cp = cuda.cupy()
        buf = cp.ascontiguousarray(array, dtype=np.float32)
        if self.nccl is not None:
            from cupy.cuda import nccl
            stream = cp.cuda.get_current_stream()
            self.nccl.allReduce(buf.data.ptr, buf.data.ptr, buf.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
            return buf
        host = buf.get()
        self.comm.Allreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM)
        buf.set(host)
        return buf

    def allgather_rows(self, ids, rows):
        """Every worker's (ids, rows) concatenated in rank order: a sparse gradient summed across
        workers without densifying it. Device arrays travel through host memory and come back
        to the device."""
        if cuda.is_device_array(rows):
            cp = cuda.cupy()
            all_ids, all_rows = self.allgather_rows(cuda.to_host(ids), cuda.to_host(rows))
            return cp.asarray(all_ids), cp.asarray(all_rows)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        width = rows.shape[1] if rows.ndim == 2 else 0
        counts = np.array(self.comm.allgather(len(ids)), dtype=np.int64)
        all_ids = np.empty(int(counts.sum()), dtype=np.int64)
        all_rows = np.empty((int(counts.sum()), width), dtype=np.float32)
        self.comm.Allgatherv(ids, [all_ids, counts])
        self.comm.Allgatherv(rows.reshape(-1), [all_rows.reshape(-1), counts * width])
        return all_ids, all_rows

    def allgather_array(self, array):
        """Every worker's 1-D host array concatenated in rank order (lengths may differ): what a
        metric of the whole model is computed over."""
        array = np.ascontiguousarray(array).reshape(-1)
        counts = np.array(self.comm.allgather(len(array)), dtype=np.int64)
        out = np.empty(int(counts.sum()), dtype=array.dtype)
        self.comm.Allgatherv(array, [out, counts])
        return out

    def allreduce_mean(self, value):
        """The mean of a float over the workers."""
        return self.comm.allreduce(float(value), op=self.MPI.SUM) / self.size

    def barrier(self):
        self.comm.Barrier()
