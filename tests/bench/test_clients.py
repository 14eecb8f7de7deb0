"""The clients scenario's patterns (bench.clients), on local files: the same bytes each run, every
pattern reads and checks them, a changed byte is caught, and `--only clients` names them all.
The mounts and the counting proxy around them are run by the bench's smoke test."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from bench import clients
from bench.cli import client_patterns_of, client_sizes, measured_steps, parse_args
from bench.scenarios import CLIENT_KEYS

TINY = replace(
    clients.ClientSizes.quick(),
    parquet_files=2,
    parquet_rows=4000,
    tensors=8,
    tensor_size=64 * 1024,
    arrow_rows=600,
    arrow_row_size=1024,
    arrow_batches=4,
    arrow_batch_rows=8,
    tar_shards=2,
    tar_samples=5,
    tar_sample_size=4096,
)


def _generate(root: Path) -> clients.ClientData:
    store = root / "store"

    def put(local: str, key: str) -> None:
        (store / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(local, store / key)

    work = root / "work"
    work.mkdir(parents=True)
    return clients.generate(TINY, str(work), put)


def test_every_pattern_reads_what_was_generated_and_the_files_are_seeded(tmp_path: Path) -> None:
    first = _generate(tmp_path / "a")
    second = _generate(tmp_path / "b")
    for key in clients.keys(first):
        assert (tmp_path / "a/store" / key).read_bytes() == (
            tmp_path / "b/store" / key
        ).read_bytes()
    for pattern in clients.PATTERNS:
        clients.RUNNERS[pattern](str(tmp_path / "a/store"), first)()
        assert clients.read_bytes(first, pattern) > 0
    # A projection needs less than the files it reads; the other sizes are what was written.
    assert first.projection_bytes < first.scan_bytes
    assert first.full_bytes == os.path.getsize(tmp_path / "a/store" / clients.FULL_KEY)
    assert second.tar_sha256 == first.tar_sha256
    # What any system must fetch (the floors' bytes): the Arrow file whole, else what was read.
    arrow_file = os.path.getsize(tmp_path / "a/store" / clients.ARROW_KEY)
    assert clients.must_fetch_bytes(first, "arrow_batches") == arrow_file > first.arrow_bytes
    assert clients.must_fetch_bytes(first, "parquet_columns") == first.projection_bytes


@pytest.mark.parametrize(
    ("pattern", "key", "offset"),
    [
        ("safetensors_full", clients.FULL_KEY, -100),
        ("tar", f"{clients.TAR_DIR}/shard-000001.tar", 1024),
        ("arrow_batches", clients.ARROW_KEY, None),
    ],
)
def test_a_changed_byte_fails_the_pattern(
    tmp_path: Path, pattern: str, key: str, offset: int | None
) -> None:
    data = _generate(tmp_path)
    store = tmp_path / "store"
    path = store / key
    raw = bytearray(path.read_bytes())
    if offset is None:  # every row's value: some taken row changes, whichever is drawn
        image = data.sizes.arrow_row_size
        for start in range(len(raw) // 2, len(raw) - image, image // 2):
            raw[start] ^= 0xFF
    else:
        raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))
    check = clients.RUNNERS[pattern](str(store), data)  # the bytes read: checked after
    with pytest.raises(RuntimeError, match="not"):
        check()


def test_only_clients_names_every_figure_of_the_scenario() -> None:
    args = parse_args(["--only", "clients", "--quick"])
    assert args.only.split(",") == CLIENT_KEYS
    assert client_patterns_of(measured_steps(args.only)) == clients.PATTERNS
    assert client_sizes(args) == clients.ClientSizes.quick()
    one = parse_args(["--only", "clients_tar_fetched_x,write_mbs"])
    assert client_patterns_of(measured_steps(one.only)) == ["tar"]
    assert client_sizes(parse_args(["--only", "write_mbs"])) is None


def test_the_warm_up_runs_every_pattern_once_the_scan_at_the_runs_sizes_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before any clock starts, each pattern's library is used once (its first use in a process
    costs what no later one does), over files of its own that it removes; at a run's own sizes
    the Parquet scan WARM_SCANS times more (its allocator's first large mappings)."""
    ran: list[str] = []

    def counted(name: str, runner: clients.Runner) -> clients.Runner:
        def run(root: str, data: clients.ClientData) -> clients.Check:
            ran.append(name)
            return runner(root, data)

        return run

    runners = {name: counted(name, runner) for name, runner in clients.RUNNERS.items()}
    monkeypatch.setattr(clients, "RUNNERS", runners)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    clients.warm_libraries.__wrapped__()
    assert sorted(ran) == sorted(clients.RUNNERS)
    assert list(tmp_path.iterdir()) == []
    ran.clear()
    scans: list[int] = []

    def scan(root: str, data: clients.ClientData) -> clients.Check:
        scans.append(1)
        return runners["parquet_scan"](root, data)

    monkeypatch.setattr(clients, "parquet_scan", scan)
    larger = replace(clients.ClientSizes.quick(), parquet_files=2, parquet_rows=20_000)
    clients.warm_libraries.__wrapped__(larger)  # the run's sizes: its scan, WARM_SCANS times
    assert len(scans) == clients.WARM_SCANS
    assert list(tmp_path.iterdir()) == []
