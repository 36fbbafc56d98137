"""Fixtures of the cache tests."""

import pytest


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path):
    """A cache root, once on local disk and once on the GCS emulator."""
    if request.param == "local":
        return str(tmp_path / "cache")
    return request.getfixturevalue("gcs_bucket") + "/cache"
