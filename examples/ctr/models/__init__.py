"""CTR models, named <model>_<dataset> as in Hetu's examples."""
from .dcn import dcn_avazu, dcn_criteo
from .dfm import dfm_avazu, dfm_criteo
from .ncf import ncf_movielens
from .wdl import wdl_avazu, wdl_criteo

MODELS = {f.__name__: f for f in (wdl_criteo, wdl_avazu, dfm_criteo, dfm_avazu, dcn_criteo, dcn_avazu,
                                  ncf_movielens)}


def dataset_of(model_name):
    return model_name.rsplit("_", 1)[1]
