"""The `store` fixture: each contract test runs once per store (tests/backends/stores.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.backends.stores import HDFS_URI, Store, arrow_store, hdfs_store, local_store, s3_store


@pytest.fixture(params=["local", "s3", "rgw", "arrow", "hdfs"])
def store(request, tmp_path) -> Iterator[Store]:
    if request.param == "local":
        yield local_store(tmp_path)
    elif request.param == "arrow":
        yield arrow_store(tmp_path)
    elif request.param == "hdfs":
        if not HDFS_URI:
            pytest.skip("no HDFS cluster here: set PFFS_TEST_HDFS_URI=hdfs://namenode:8020/tmp")
        yield hdfs_store(HDFS_URI)
    elif request.param == "rgw":  # skips, with the reason, where Ceph cannot run
        rgw = request.getfixturevalue("rgw")
        s3, bucket = request.getfixturevalue("rgw_s3"), request.getfixturevalue("rgw_bucket")
        yield s3_store("rgw", rgw.endpoint, s3, bucket)
    else:
        moto = request.getfixturevalue("moto")
        s3, bucket = request.getfixturevalue("s3"), request.getfixturevalue("bucket")
        yield s3_store("s3", moto.endpoint_url, s3, bucket)
