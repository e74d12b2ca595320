"""GPU plumbing shared by the op families (docs/design.md section 12): the project's own kernels
compiled once, the executor's stream, pinned host staging for the one host-to-device copy of a
step's rows and the one device-to-host copy of its summed gradient, and checks that a kernel
records on the device and the executor reads once per step.

Nothing here imports CuPy at module load: a CPU-only machine never needs it."""
import numpy as np

_kernels = {}
# Kernels are compiled without contracting a*b+c into fused multiply-adds, so that the optimizer
# steps round exactly as the C++ rules of src/common/optim_rules.h do on the host.
KERNEL_OPTIONS = ("--fmad=false",)


def cupy():
    import cupy as cp
    return cp


def raw_kernel(name, source):
    """The kernel `name` of `source`, compiled on first use (CuPy caches the binary on disk)."""
    key = (name, source)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = cupy().RawKernel(source, name, options=KERNEL_OPTIONS)
    return k


def elementwise(name, in_params, out_params, body, preamble=""):
    key = ("elementwise", name)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = cupy().ElementwiseKernel(in_params, out_params, body, name, preamble=preamble,
                                                    options=KERNEL_OPTIONS)
    return k


# Blocks for kernels that loop over their items (grid-stride): enough to fill a large GPU.
STRIDE_BLOCKS = 4096


def launch(kernel, threads, args, block=256, max_blocks=None):
    """One thread per item of `threads` items (at least one block, so empty work is a no-op launch
    that a captured graph can still hold); at most `max_blocks` blocks for kernels that loop."""
    grid = max(1, (int(threads) + block - 1) // block)
    if max_blocks is not None:
        grid = min(grid, max_blocks)
    kernel((grid,), (block,), args)


_ones = {}


def ones_row(n):
    """A [1, n] float32 device array of ones, made once per n (summing by a matrix product)."""
    row = _ones.get(n)
    if row is None:
        row = _ones[n] = cupy().ones((1, n), dtype=np.float32)
    return row


def is_device_array(x):
    return type(x).__module__.startswith("cupy")


def to_host(x):
    """A NumPy array of x (a copy from the device, or x itself on the host)."""
    return x.get() if is_device_array(x) else x


def pinned_array(nbytes):
    """A uint8 NumPy array over new page-locked host memory (from CuPy's pinned pool)."""
    mem = cupy().cuda.alloc_pinned_memory(int(nbytes))
    return np.frombuffer(mem, dtype=np.uint8, count=int(nbytes))


class PinnedBuffer:
    """Page-locked host memory, grown as needed, with the event of the last copy that used it:
    the host waits for that copy before it writes the buffer again."""

    def __init__(self):
        self._host, self._event = None, None

    def view(self, nbytes):
        if self._event is not None:
            self._event.synchronize()
        if self._host is None or nbytes > self._host.size:
            self._host = pinned_array(max(int(nbytes), 2 * (0 if self._host is None else self._host.size), 1 << 16))
        return self._host[:nbytes]

    def record(self):
        cp = cupy()
        self._event = cp.cuda.Event(block=False, disable_timing=True)
        self._event.record()


class Packed:
    """Arrays of several dtypes laid out one after another in one byte buffer (each 8-byte
    aligned), so that they cross between host and device in one copy."""

    def __init__(self, specs):
        """specs: [(shape, dtype)]."""
        self.specs, self.offsets, offset = [], [], 0
        for shape, dtype in specs:
            dtype = np.dtype(dtype)
            n = int(np.prod(shape)) * dtype.itemsize
            self.specs.append((tuple(shape), dtype))
            self.offsets.append(offset)
            offset += (n + 7) // 8 * 8
        self.nbytes = offset

    def views(self, buf):
        out = []
        for (shape, dtype), offset in zip(self.specs, self.offsets):
            n = int(np.prod(shape)) * dtype.itemsize
            out.append(buf[offset:offset + n].view(dtype).reshape(shape))
        return out


def _device_bytes(current, nbytes):
    """`current` (a device byte buffer, or None), or a larger one where it holds less than nbytes."""
    if current is None or current.size < nbytes:
        return cupy().empty(max(nbytes, 1 << 16), dtype=np.uint8)
    return current


class HostToDevice:
    """Copies host arrays to the device in one pinned copy: `send(arrays)` returns device views
    that stay valid until the next send."""

    def __init__(self):
        self.pinned = PinnedBuffer()
        self._device = None

    def send(self, arrays):
        cp = cupy()
        if not arrays:
            return []
        layout = Packed([(a.shape, a.dtype) for a in arrays])
        host = self.pinned.view(layout.nbytes)
        for dst, src in zip(layout.views(host), arrays):
            np.copyto(dst, src, casting="no")
        self._device = _device_bytes(self._device, layout.nbytes)
        device = self._device[:layout.nbytes]
        device.set(host, stream=cp.cuda.get_current_stream())
        self.pinned.record()
        return layout.views(device)


class DeviceToHost:
    """The reverse: a device byte buffer that kernels write arrays into (`views`), read back in one
    copy of its first `nbytes` (`receive`) into pinned host memory, valid until the next receive."""

    def __init__(self):
        self.pinned = PinnedBuffer()
        self._device = None

    def device_views(self, layout):
        self._device = _device_bytes(self._device, layout.nbytes)
        return layout.views(self._device)

    def receive(self, layout, nbytes):
        host = self.pinned.view(layout.nbytes)
        if nbytes:   # a blocking copy: the host arrays are complete when it returns
            self._device[:nbytes].get(stream=cupy().cuda.get_current_stream(), out=host[:nbytes])
        return layout.views(host)


class DeviceChecks:
    """Errors that kernels record on the device (an id outside a table, a non-finite loss): the
    executor reads them all in one copy after the step, so a step needs no synchronisation of its
    own and can be captured as a CUDA graph. Each check owns one int64 slot, -1 while fine."""
    CAPACITY = 64

    def __init__(self):
        self._slots = cupy().full(self.CAPACITY, -1, dtype=np.int64)
        self._index = {}        # key -> slot
        self._describe = []     # slot -> describe(value) -> the exception to raise

    def slot(self, key, describe):
        """The device int64 of `key` (a view, the same every step); `describe(value)` makes the
        exception to raise when a kernel wrote `value` there."""
        i = self._index.get(key)
        if i is None:
            if len(self._describe) == self.CAPACITY:
                raise RuntimeError(f"more than {self.CAPACITY} device checks in one graph")
            i = self._index[key] = len(self._describe)
            self._describe.append(describe)
        return self._slots[i:i + 1]

    def reset(self):
        self._slots.fill(-1)

    def raise_if_any(self):
        if not self._describe:
            return
        values = self._slots[:len(self._describe)].get()
        for describe, value in zip(self._describe, values):
            if value != -1:
                raise describe(int(value))


class Cublas:
    """cuBLAS called directly (ctypes) with a handle of hetu's own: CuPy refuses any cuBLAS call
    while a stream is being captured, though cuBLAS itself supports capture given a workspace of
    its own, which this handle has. One handle per process, its stream set to the current one at
    every call."""
    WORKSPACE_BYTES = 32 << 20
    _instance = None

    @classmethod
    def get(cls):
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self):
        import ctypes
        self.ctypes = ctypes
        self.lib = ctypes.CDLL(_cublas_path())
        handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = handle
        self.workspace = cupy().empty(self.WORKSPACE_BYTES, dtype=np.uint8)
        self._check(self.lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(self.workspace.data.ptr),
                                                   ctypes.c_size_t(self.WORKSPACE_BYTES)), "cublasSetWorkspace")
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    @staticmethod
    def _check(status, what):
        if status != 0:
            raise RuntimeError(f"{what} failed with cuBLAS status {status}")

    def matmul(self, a, b, trans_a, trans_b, out):
        """out[m, n] = op(a) @ op(b) for C-contiguous float32 device arrays (op: transpose or not)."""
        c = self.ctypes
        m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
        n = b.shape[0] if trans_b else b.shape[1]
        if m == 0 or n == 0 or k == 0:
            return out.fill(0) or out
        self._check(self.lib.cublasSetStream_v2(self.handle, c.c_void_p(cupy().cuda.get_current_stream().ptr)),
                    "cublasSetStream")
        # Row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T.
        self._check(self.lib.cublasSgemm_v2(
            self.handle, c.c_int(1 if trans_b else 0), c.c_int(1 if trans_a else 0), c.c_int(n), c.c_int(m),
            c.c_int(k), c.byref(self._one), c.c_void_p(b.data.ptr), c.c_int(b.shape[1]), c.c_void_p(a.data.ptr),
            c.c_int(a.shape[1]), c.byref(self._zero), c.c_void_p(out.data.ptr), c.c_int(n)), "cublasSgemm")
        return out


def _cublas_path():
    """The libcublas that CuPy loaded (so both use one), else one the loader finds."""
    import ctypes.util
    import glob
    import os
    try:
        from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads libcublas)
    except ImportError:
        pass
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libcublas.so"):
                    return path
    except OSError:
        pass
    found = ctypes.util.find_library("cublas")
    if found:
        return found
    for pattern in ("/usr/local/cuda/lib64/libcublas.so*", "/usr/lib/x86_64-linux-gnu/libcublas.so*"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    raise RuntimeError("libcublas not found: hetu's GPU matmul needs the CUDA runtime's cuBLAS")
