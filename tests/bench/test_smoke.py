"""`python -m bench --quick` as a smoke test: every scenario produces a number for every system.

It checks that the suite runs end to end against real servers and real mounts, not how fast
anything is (speed is measured by the bench itself, never by tests).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.clients import PATTERNS
from bench.scenarios import METRICS, PFFS_ONLY
from tests.bench.sizes import SMALL_DATASET

pytestmark = [pytest.mark.mount, pytest.mark.slow]
QUICK = [sys.executable, "-m", "bench", "--quick"]
# Every scenario of the systems' runs, by name: all but the cache group scenario, which would
# only add its runs here (a failed one is its figure, an "error: ..." string) and is checked,
# its figures, tables and `--only group` included, by tests/bench/test_group.py.
EVERY_METRIC = ["--only", ",".join(metric.key for metric in METRICS)]


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is missing (apt-get install fio)")
@pytest.mark.timeout(1200)  # past the bench's own 900 s bound below
def test_quick_bench_produces_every_figure(tmp_path: Path) -> None:
    result = subprocess.run(
        # Smaller than --quick's sets and files, and one round trip, 1 ms behind the delay
        # proxy: every figure is still produced, through the proxy, and the peers' round trip
        # per file (the epochs, the small files, ls -lR of the tree) stays short. A second
        # latency would run every system again for no figure of its own (the charts of several
        # servers and latencies: tests/bench/test_report.py).
        [*QUICK, "--out", str(tmp_path), "--latency", "1ms", *SMALL_DATASET, *EVERY_METRIC],
        capture_output=True,
        text=True,
        timeout=900,  # a few minutes on a busy 2-core machine
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [run_dir] = list(tmp_path.iterdir())
    payload = json.loads((run_dir / "results.json").read_text())
    summary = payload["summary"]
    assert not summary["skipped_servers"], summary["skipped_servers"]
    assert summary["groups"] == []  # --only without "group"
    names = [server["name"] for server in summary["servers"]]
    # --quick runs s3rver alone, here behind the delay proxy at 1 ms.
    assert names == ["s3rver, 1 ms"]
    for server in summary["servers"]:
        assert server["systems"] == ["pffs", "s3fs", "rclone"]
        assert not server["unavailable"], server["unavailable"]
        ceilings = server["ceilings"]
        assert ceilings["server_mbs"] > 0 and ceilings["local_disk_mbs"] > 0
        assert ceilings["store_files_per_s"] > 0
        for system in server["systems"]:
            figures = server["medians"][system]
            for metric in METRICS:
                value = figures.get(metric.key)
                if system != "pffs" and metric.key in PFFS_ONLY:
                    assert str(value).startswith("n/a"), (server["name"], system, metric.key)
                    continue
                assert isinstance(value, int | float), (server["name"], system, metric.key, value)
    for run in payload["runs"]:
        assert run["results"]["verified"] == "yes", run
    assert sorted(p.name for p in run_dir.glob("*.png")) == [
        "bench-s3rver.png",
        "bench-summary.png",
    ]
    assert "| sequential read, cold |" in result.stdout
    assert "| training epoch 1, cold (8 readers) |" in result.stdout
    assert "Epoch 1 against the store's own files/s: pffs " in result.stdout
    assert "| training epoch 2 after a remount |" in result.stdout
    # The clients' floors: the quick Arrow file (16 MiB) is larger than this large file (8
    # MiB), so their ceiling is measured over it.
    assert "Clients against the store's floor" in result.stdout
    for server in summary["servers"]:
        assert server["ceilings"]["clients_server_mbs"] > 0
        assert set(server["clients_must_fetch_bytes"]) == set(PATTERNS)
    assert "| ls -lR of the tree (100 directories), cold |" in result.stdout
    assert "Store requests during epoch 2 after a remount (first rep): pffs GET " in result.stdout
    for run in payload["runs"]:
        kinds = run["results"]["epoch2_remount_requests_by_kind"]
        counted = sum(int(part.split(" ")[1]) for part in kinds.split(", "))
        assert counted == run["results"]["epoch2_remount_requests"], run
