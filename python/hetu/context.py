"""Device contexts: where a node's value lives and which array library computes it."""
import numpy as np


class DeviceContext:
    def __init__(self, device_type, device_id=0):
        if device_type not in ("cpu", "gpu"):
            raise ValueError(f"unknown device type {device_type!r}: expected 'cpu' or 'gpu'")
        self.device_type = device_type
        self.device_id = int(device_id)

    @property
    def is_gpu(self):
        return self.device_type == "gpu"

    def array_module(self):
        """numpy on CPU, cupy (selected on this device) on GPU."""
        if not self.is_gpu:
            return np
        try:
            import cupy
        except ImportError as e:
            raise RuntimeError(f"{self} needs CuPy, which is not installed (pip install cupy-cuda12x)") from e
        if cupy.cuda.runtime.getDeviceCount() <= self.device_id:
            raise RuntimeError(f"{self}: no such GPU on this machine")
        cupy.cuda.Device(self.device_id).use()
        return cupy

    def __eq__(self, other):
        return isinstance(other, DeviceContext) and (self.device_type, self.device_id) == (
            other.device_type, other.device_id)

    def __hash__(self):
        return hash((self.device_type, self.device_id))

    def __repr__(self):
        return f"{self.device_type}({self.device_id})"


def cpu(device_id=0):
    return DeviceContext("cpu", device_id)


def gpu(device_id=0):
    return DeviceContext("gpu", device_id)


def is_gpu_ctx(ctx):
    return ctx is not None and ctx.is_gpu


def array_module_of(x):
    """The array library (numpy or cupy) that owns x."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        import cupy
        return cupy
    return np
