"""Collective communication between workers over MPI (mpi4py), for AllReduce aggregation."""
import numpy as np


class MPICommunicator:
    def __init__(self):
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise RuntimeError("AllReduce aggregation needs mpi4py (pip install mpi4py) and an MPI launch "
                               "(python/runner.py starts workers through mpirun)") from e
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
