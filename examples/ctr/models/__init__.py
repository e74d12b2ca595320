"""CTR models, named <model>_<dataset> as in Hetu's examples; <model>_<dataset>_multihot reads
the multi-hot shape of the dataset (MLPerf's for Criteo). Models in READS_BAGS take each field's
slot count (`field_slots`) from the data, so one model reads single-id and multi-hot fields."""
from .dcn import dcn_avazu, dcn_criteo
from .dcnv2 import dcnv2_criteo
from .dfm import dfm_avazu, dfm_criteo
from .dlrm import dlrm_criteo, dlrm_movielens
from .ncf import ncf_movielens
from .wdl import wdl_avazu, wdl_criteo

MODELS = {f.__name__: f for f in (wdl_criteo, wdl_avazu, dfm_criteo, dfm_avazu, dcn_criteo, dcn_avazu,
                                  ncf_movielens, dlrm_criteo, dcnv2_criteo, dlrm_movielens)}
MODELS.update({"dlrm_criteo_multihot": dlrm_criteo, "dcnv2_criteo_multihot": dcnv2_criteo})
READS_BAGS = {"dlrm_criteo", "dcnv2_criteo", "dlrm_movielens", "dlrm_criteo_multihot", "dcnv2_criteo_multihot"}


def dataset_of(model_name):
    """The dataset a model is named for: its synthetic shape ("criteo", "criteo-multihot", ...)."""
    name = model_name.split("_", 1)[1]
    return name.replace("_", "-")
