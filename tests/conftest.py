import inspect
import multiprocessing
import os
import pathlib
import subprocess
import sys
import types

import pytest

import jobs
from hetu_tools.netns import NamespaceHosts

REPO = pathlib.Path(__file__).resolve().parent.parent
TESTS = pathlib.Path(__file__).resolve().parent

# A test that starts processes (a ps-lite cluster, the launcher, mpirun, network namespaces, a
# training or tool run) is marked `cluster`; the others run in this process: `pytest -m "not
# cluster"` runs those, `pytest -m cluster` the rest (tests/README.md). A test starts processes if
# its code, its fixtures' or that of the suite's functions and classes it calls names the job
# harness (jobs.py), subprocess, multiprocessing or NamespaceHosts.
PROCESS_STARTERS = (jobs, subprocess, multiprocessing, NamespaceHosts)


def _names_process_starter(code, scope, seen):
    if code in seen:
        return False
    seen.add(code)
    # The suite's modules a function imports itself: the names it takes from them are theirs.
    imported = [vars(sys.modules[n]) for n in code.co_names if n in sys.modules and (TESTS / f"{n}.py").exists()]
    for name in code.co_names:
        if name in ("jobs", "subprocess", "multiprocessing"):   # a module by name, or imported in a function
            return True
        if any(_starts_processes(s.get(name), seen) for s in [scope, *imported]):
            return True
    return any(_names_process_starter(c, scope, seen) for c in code.co_consts if isinstance(c, types.CodeType))


def _starts_processes(obj, seen):
    """Whether obj, a function or class of the suite, or a module, starts processes (see above)."""
    if any(obj is s for s in PROCESS_STARTERS) or getattr(obj, "__module__", None) == jobs.__name__:
        return True
    if isinstance(obj, types.ModuleType):
        return False
    try:
        defined_here = pathlib.Path(inspect.getfile(obj)).resolve().parent == TESTS
    except TypeError:
        return False
    if not defined_here:
        return False
    if inspect.isclass(obj):
        return any(_starts_processes(f, seen) for f in vars(obj).values() if inspect.isfunction(f))
    obj = inspect.unwrap(getattr(obj, "__func__", obj))
    return inspect.isfunction(obj) and _names_process_starter(obj.__code__, obj.__globals__, seen)


def pytest_collection_modifyitems(items):
    for item in items:
        seen = set()
        fixtures = [fd.func for defs in item._fixtureinfo.name2fixturedefs.values() for fd in defs]
        if any(_starts_processes(f, seen) for f in [item.function, *fixtures]):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def data_home(tmp_path_factory):
    """A private synthetic-data cache for the session, shared by the tests that train."""
    home = os.environ.get("HETU_TEST_DATA_HOME") or str(tmp_path_factory.mktemp("hetu-data"))
    return home
