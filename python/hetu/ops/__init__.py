"""The op vocabulary, one module per family; each op's forward, gradient and ONNX mapping
(``to_onnx(b, x)``, for serving: hetu.serve.onnx_graph) sit together."""
from .math import *  # noqa: F401,F403
from .activation import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .norm import *  # noqa: F401,F403
from .embedding import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .sequence import *  # noqa: F401,F403
