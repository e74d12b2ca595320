import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def data_home(tmp_path_factory):
    """A private synthetic-data cache for the session, shared by the tests that train."""
    home = os.environ.get("HETU_TEST_DATA_HOME") or str(tmp_path_factory.mktemp("hetu-data"))
    return home
