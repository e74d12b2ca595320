"""Collective communication between workers over MPI (mpi4py), for AllReduce aggregation."""
import os
import sys

import numpy as np

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

    def allreduce_sum(self, array):
        """Sum over workers, in place."""
        buf = np.ascontiguousarray(array, dtype=np.float32)
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        return buf

    def allgather_rows(self, ids, rows):
        """Every worker's (ids, rows) concatenated in rank order: a sparse gradient summed across
        workers without densifying it."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        width = rows.shape[1] if rows.ndim == 2 else 0
        counts = np.array(self.comm.allgather(len(ids)), dtype=np.int64)
        all_ids = np.empty(int(counts.sum()), dtype=np.int64)
        all_rows = np.empty((int(counts.sum()), width), dtype=np.float32)
        self.comm.Allgatherv(ids, [all_ids, counts])
        self.comm.Allgatherv(rows.reshape(-1), [all_rows.reshape(-1), counts * width])
        return all_ids, all_rows

    def barrier(self):
        self.comm.Barrier()
