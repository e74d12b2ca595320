"""hetu: define-then-run dataflow graphs for recommendation models.

Follow a step's data: hetu.data (datasets) -> hetu.dataloader (batches) -> hetu.ops (the graph)
-> hetu.executor (compile with hetu.passes, run) -> hetu.optim (updates)."""
from . import threads  # noqa: F401  (first: it sets how OpenBLAS's threads wait before numpy loads it)
from . import init, layers, lr, metrics, ops  # noqa: F401
from . import optim  # noqa: F401
from .autodiff import gradients  # noqa: F401
from .context import DeviceContext, cpu, gpu  # noqa: F401
from .dataloader import Dataloader, DataloaderOp, dataloader_op  # noqa: F401
from .executor import Executor  # noqa: F401
from .graph import Op, Variable, placeholder_op, print_graph, topo_sort  # noqa: F401
from .ndarray import NDArray, array, empty  # noqa: F401
from .ops import *  # noqa: F401,F403
from .ops.common import ShapeError  # noqa: F401

__version__ = "0.1.0"
