"""The optimizer registry as Python reads it, and the device step's source: optim_step.h (the
host's rules) with hetu.optim's kernels, compiled by nvcc where the CUDA toolkit is installed
(what NVRTC compiles on a GPU machine; no GPU needed here)."""
import shutil
import subprocess

import pytest

import hetu as ht
import hetu.ps as ps
from hetu import _C


def test_every_place_reads_the_kinds_from_the_registry():
    names = [k["name"] for k in _C.optimizer_kinds()]
    assert list(ht.optim.KIND_NAMES.values()) == names
    assert ps.OPTIMIZERS == {name: kind for kind, name in enumerate(names)}
    assert ps._OPTIM_DEFAULTS == dict(momentum=0.9, beta1=0.9, beta2=0.999, eps=1e-7, l2reg=0.0, weight_decay=0.0,
                                   catch_up_lr=0.0)
    for name in names:
        opt = ht.optim.optimizer(name, learning_rate=0.1)
        assert ht.optim.KIND_NAMES[opt.config.kind] == name
        assert opt.state_width(8) == _C.optim_state_width(opt.config.kind, 8)


def test_a_setting_the_kind_does_not_read_is_refused():
    with pytest.raises(ValueError, match="weight_decay"):
        ht.optim.optimizer("adam", weight_decay=0.1)
    with pytest.raises(ValueError, match="expected one of"):
        ht.optim.optimizer("lion")


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
@pytest.mark.parametrize("rtc", [False, True], ids=["nvcc", "rtc_branch"])
def test_the_device_step_source_compiles(tmp_path, rtc):
    """The exact text hetu.optim gives NVRTC, compiled as NVRTC would (no fused multiply-adds,
    C++11). `rtc_branch`: optim_step.h's NVRTC-only lines (no standard headers) in place of
    nvcc's, which nvcc cannot take with __CUDACC_RTC__ itself defined."""
    source = ht.optim.step_source()
    if rtc:
        source = "#define HETU_NVRTC_CHECK 1\n" + source.replace("__CUDACC_RTC__", "HETU_NVRTC_CHECK")
    path = tmp_path / "step.cu"
    path.write_text(source)
    subprocess.run([NVCC, "-c", "-x", "cu", *ht.cuda.KERNEL_OPTIONS, "-std=c++11", str(path), "-o",
                    str(tmp_path / "step.o")], check=True, timeout=300)

