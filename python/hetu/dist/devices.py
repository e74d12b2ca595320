"""Which device a worker trains on: worker w of a host takes GPU (w's local rank mod the host's GPUs).

The host's GPU count comes from HETU_GPUS (exported by the launcher from the cluster file's
`gpus:` or runner.py's --gpus), else from CuPy; the local rank from the MPI launcher."""
import os

from hetu import env
from hetu.context import cpu, gpu

GPUS_VAR = "HETU_GPUS"
# The worker's rank among the workers of its host, as OpenMPI, MPICH / Intel MPI, PMI and Slurm name it.
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID")


def pick_gpu(local_rank, gpus):
    """The GPU of the worker with this local rank on a host with `gpus` GPUs."""
    if gpus < 1:
        raise ValueError(f"pick_gpu: a host needs at least 1 GPU to place a worker on, got gpus={gpus}")
    if local_rank < 0:
        raise ValueError(f"pick_gpu: local rank must be >= 0, got {local_rank}")
    return local_rank % gpus


def local_rank():
    """This worker's rank among the workers of its host (0 when no launcher says)."""
    for name in LOCAL_RANK_VARS:
        value = os.environ.get(name)
        if value is None or value.strip() == "":
            continue
        try:
            rank = int(value)
        except ValueError:
            rank = -1
        if rank < 0:
            raise ValueError(f"{name} must be an integer >= 0 (the local rank), got {value!r}")
        return rank
    return 0


def gpus_on_host():
    """The number of GPUs on this host: HETU_GPUS if set, else the CUDA devices CuPy sees."""
    value = env.raw(GPUS_VAR)
    if value is not None:
        try:
            gpus = int(value)
        except ValueError:
            gpus = 0
        if gpus < 1:
            raise ValueError(f"{GPUS_VAR} must be a positive integer (the GPUs on this host), got {value!r}")
        return gpus
    try:
        import cupy
    except ImportError:
        raise RuntimeError("--gpu needs CuPy and a GPU: CuPy is not installed "
                           "(pip install cupy-cuda12x)") from None
    try:
        gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:   # no driver, no device: CuPy's CUDARuntimeError
        raise RuntimeError(f"--gpu needs CuPy and a GPU: CuPy finds no CUDA device "
                           f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if gpus < 1:
        raise RuntimeError("--gpu needs CuPy and a GPU: CuPy sees no CUDA device on this host")
    return gpus


def worker_context(use_gpu):
    """The Executor's ctx for this worker: cpu(0), or with use_gpu its GPU on this host."""
    if not use_gpu:
        return cpu(0)
    return gpu(pick_gpu(local_rank(), gpus_on_host()))
