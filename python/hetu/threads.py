"""How many threads a hetu process runs its kernels and BLAS on.

By default a process takes its share of the host: the cores it may use (its CPU affinity, and
the CPU quota of its cgroup, which a container's limit sets) divided by the job's processes on
the host. Every process taking every core made two workers on two cores spin against each other
(3-4x slower than one thread each). The launcher says how many processes it starts on a host in
HETU_PROCS_ON_HOST; under a bare mpirun, OMPI_COMM_WORLD_LOCAL_SIZE counts the host's workers.

Standard library only: the launcher's worker shim runs this file's source as a script (printing
the count) before the worker's interpreter, and with it BLAS, starts."""
import ctypes
import math
import os

# The variables that size a process's threads: OpenMP, the BLAS libraries, hetu's kernels.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "HETU_NUM_THREADS")
PROCS_VAR = "HETU_PROCS_ON_HOST"
# OpenBLAS's idle threads spin for about 2^28 cycles (0.1 s) after each call before they sleep;
# between BLAS calls hetu's kernels run on threads of their own, which then share the cores with
# those spinning threads (a DLRM step on 2 cores 17% slower, WDL's 5%). 4: 2^4 cycles, they sleep
# at once. OpenBLAS reads it when it loads: hetu sets it on import, before numpy, unless set.
BLAS_WAIT_VAR, BLAS_WAIT = "OPENBLAS_THREAD_TIMEOUT", "4"


def no_blas_spin(environ=None):
    """OpenBLAS's threads told to sleep, not spin, between calls (BLAS_WAIT_VAR), unless set."""
    environ = os.environ if environ is None else environ
    environ.setdefault(BLAS_WAIT_VAR, BLAS_WAIT)


def cgroup_cpu_limit(cgroup_root="/sys/fs/cgroup", self_cgroup="/proc/self/cgroup"):
    """The CPUs the process's cgroup quota allows (a fraction, e.g. 1.5), or None without one.
    cgroup v2: cpu.max ("<quota> <period>" or "max <period>"); v1: cpu.cfs_quota_us and
    cpu.cfs_period_us (quota -1: none). The process's own cgroup folder is tried first, then the
    root (inside a container the root is the container's)."""
    v2, v1 = [], []
    try:
        with open(self_cgroup) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    v2.append(path)
                elif "cpu" in controllers.split(","):
                    v1.append((controllers, path))
    except (OSError, ValueError):
        pass
    for path in [*v2, "/"]:
        value = _read(os.path.join(cgroup_root, path.lstrip("/"), "cpu.max"))
        if value:
            quota, _, period = value.partition(" ")
            if quota == "max":
                return None
            return _quota(quota, period)
    for folder in [os.path.join(c, p.lstrip("/")) for c, p in v1] + ["cpu", "cpu,cpuacct", ""]:
        base = os.path.join(cgroup_root, folder)
        quota, period = _read(os.path.join(base, "cpu.cfs_quota_us")), _read(os.path.join(base, "cpu.cfs_period_us"))
        if quota and period:
            return None if quota.startswith("-") else _quota(quota, period)
    return None


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _quota(quota, period):
    try:
        quota, period = int(quota), int(period)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cores(affinity=None, cgroup_limit=None):
    """The cores this process may run on: its affinity mask (`affinity`: a set of CPUs, default
    the process's own), at most its cgroup's quota rounded up (`cgroup_limit`: default read)."""
    if affinity is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = max(1, len(affinity))
    limit = cgroup_cpu_limit() if cgroup_limit is None else cgroup_limit
    if limit:
        cores = min(cores, max(1, math.ceil(limit)))
    return cores


def processes_on_host(environ=None):
    """The job's processes on this host: HETU_PROCS_ON_HOST (the launcher's count of its workers
    and servers here), else mpirun's local size (workers only), else 1."""
    environ = os.environ if environ is None else environ
    for name in (PROCS_VAR, "OMPI_COMM_WORLD_LOCAL_SIZE"):
        try:
            value = int(environ.get(name, ""))
        except ValueError:
            continue
        if value > 0:
            return value
    return 1


def default_threads(cores, processes):
    """Each process's share of the host's cores, at least one."""
    return max(1, cores // max(1, processes))


def oversubscribed(cores, processes):
    """The warning line for a host with more processes than usable cores, else None."""
    if processes <= cores:
        return None
    return (f"warning: {processes} processes of the job share this host's {cores} usable core"
            f"{'s' * (cores != 1)}: each runs 1 thread, and they will wait on each other")


def configure(threads=None, environ=None, cores=None):
    """Sizes this process's threads: `threads` if given (it wins over the environment), else
    HETU_NUM_THREADS if set, else default_threads(). The count goes into THREAD_VARS that are
    not set (all of them when `threads` is given), before hetu's kernels first read it, and into
    an OpenBLAS already loaded. Returns (count, the oversubscription warning or None)."""
    environ = os.environ if environ is None else environ
    cores = usable_cores() if cores is None else cores
    processes = processes_on_host(environ)
    if threads is None:
        try:
            threads = max(1, int(environ["HETU_NUM_THREADS"]))
        except (KeyError, ValueError):
            threads = default_threads(cores, processes)
        given = False
    else:
        given = True
    for name in THREAD_VARS:
        if given or not environ.get(name):
            environ[name] = str(threads)
    no_blas_spin(environ)
    if environ is os.environ:
        _set_loaded_openblas(int(environ["OPENBLAS_NUM_THREADS"]))
    return threads, oversubscribed(cores, processes)


def _set_loaded_openblas(threads):
    """An OpenBLAS loaded before configure() (numpy's, imported first) sized its threads from the
    environment then: set them again through its own call."""
    for setter in _openblas_setters():
        setter(ctypes.c_int(threads))


def _openblas_setters():
    """openblas_set_num_threads of each OpenBLAS loaded in this process."""
    return [f for f in (openblas_function(lib, "set_num_threads") for lib in openblas_libraries()) if f is not None]


def openblas_libraries():
    """Each OpenBLAS library loaded in this process (ctypes handles)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if line.count(" ") >= 5}
    except OSError:
        return []
    libraries = []
    for path in sorted(p for p in paths if "openblas" in os.path.basename(p).lower() and ".so" in os.path.basename(p)):
        try:
            libraries.append(ctypes.CDLL(path))
        except OSError:
            continue
    return libraries


def openblas_function(lib, name):
    """OpenBLAS's openblas_<name> in `lib`, under its plain name or numpy's build's, or None."""
    for symbol in (f"openblas_{name}", f"scipy_openblas_{name}64_", f"openblas_{name}64_"):
        function = getattr(lib, symbol, None)
        if function is not None:
            return function
    return None


class BlasThreads:
    """Runs a small matrix product on one BLAS thread and a large one on all of them
    (OPENBLAS_NUM_THREADS). Waking BLAS's other threads costs more than they save below a few
    million multiply-adds, and on a busy host the wake-up of a sleeping thread alone can take
    milliseconds (measured: a [13, 1024] x [1024, 64] product 0.03 ms, or 30 ms when it waited for
    the other thread). The choice follows from the shapes alone: processes that multiply the same
    shapes on the same thread count choose alike."""
    SMALL = 4_000_000   # multiply-adds

    def __init__(self):
        self._setters = None   # read at the first product: the thread count is set by then (configure)
        self._all = None
        self._now = None

    def for_product(self, multiply_adds):
        """Sets the BLAS's threads for a product of `multiply_adds` (m * n * k)."""
        if self._setters is None:
            try:
                self._all = max(1, int(os.environ.get("OPENBLAS_NUM_THREADS", "")))
            except ValueError:
                self._all = 1   # OpenBLAS sized itself: leave it so
            self._setters = _openblas_setters() if self._all > 1 else []
        if self._all == 1:
            return
        want = 1 if multiply_adds < self.SMALL else self._all
        if want != self._now:
            for setter in self._setters:
                setter(ctypes.c_int(want))
            self._now = want


no_blas_spin()   # on import, which hetu's __init__ does before numpy's


if __name__ == "__main__":   # the worker shim: the count configure() takes, for the variables not set
    print(configure(environ=dict(os.environ))[0])
