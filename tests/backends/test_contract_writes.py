"""The write capabilities of the contract, run on every store that declares them and skipped
with the reason on the others: put, delete, directories, renames that replace, multipart uploads.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pffs.backends.base import (
    multipart,
    writable,
)
from pffs.backends.s3writes import PART_LIMITS
from pffs.errors import Changed, NotFound, PffsError
from tests.backends.stores import TREE, declared, names_in, read_whole, staged


def test_put_new_and_replacing(store, tmp_path: Path) -> None:
    writer = declared(store, writable, "writes")
    backend = store.backend
    data = random.Random(5).randbytes(300_001)
    info = writer.put("dir/new.bin", staged(tmp_path, data))
    assert (info.name, info.size, info.is_dir) == ("new.bin", len(data), False)
    # What put returns is what the store holds: its version serves reads at once.
    assert info.version == backend.stat("dir/new.bin").version
    assert backend.read_range("dir/new.bin", 0, len(data), info.version) == data
    assert names_in(backend, "dir") == {"b.bin", "new.bin", "sub", "z.txt"}

    old = backend.stat("a.txt").version
    info = writer.put("a.txt", staged(tmp_path, b"replaced"))
    assert (info.size, backend.stat("a.txt").size) == (8, 8)
    assert info.version != old and info.version == backend.stat("a.txt").version
    assert read_whole(backend, "a.txt") == b"replaced"
    with pytest.raises(Changed):
        backend.read_range("a.txt", 0, 1, old)
    assert names_in(backend, "") == {"a.txt", "empty", "dir", "marker", "zeta"}  # no leftovers

    info = writer.put("dir/sub/zero", staged(tmp_path, b""))
    assert (info.size, backend.stat("dir/sub/zero").size, read_whole(backend, "dir/sub/zero")) == (
        0,
        0,
        b"",
    )


def test_delete(store) -> None:
    writer = declared(store, writable, "writes")
    backend = store.backend
    writer.delete("dir/z.txt")
    with pytest.raises(NotFound):
        backend.stat("dir/z.txt")
    with pytest.raises(NotFound):
        backend.read_range("dir/z.txt", 0, 1, None)
    assert names_in(backend, "dir") == {"b.bin", "sub"}
    writer.delete("dir/sub/c.txt")  # the last entry: on S3 the directory goes with it
    with pytest.raises(NotFound):
        backend.stat("dir/sub/c.txt")


def test_make_dir_and_remove_dir(store, tmp_path: Path) -> None:
    writer = declared(store, writable, "writes")
    backend = store.backend
    info = writer.make_dir("dir/new")
    assert (info.name, info.is_dir) == ("new", True)
    assert backend.stat("dir/new").is_dir
    assert list(backend.list("dir/new")) == []
    assert {i.name: i.is_dir for i in backend.list("dir")}["new"] is True
    writer.put("dir/new/f", staged(tmp_path, b"in a new directory"))  # one made is usable
    assert read_whole(backend, "dir/new/f") == b"in a new directory"
    writer.delete("dir/new/f")
    writer.remove_dir("dir/new")
    with pytest.raises(NotFound):
        backend.stat("dir/new")
    assert "new" not in names_in(backend, "dir")
    writer.remove_dir("marker")  # an empty directory the store already had
    with pytest.raises(NotFound):
        backend.stat("marker")
    assert "marker" not in names_in(backend, "")


def test_rename_a_file(store) -> None:
    writer = declared(store, writable, "writes")
    backend = store.backend
    writer.rename("a.txt", "dir/sub/moved.txt")
    with pytest.raises(NotFound):
        backend.stat("a.txt")
    assert backend.stat("dir/sub/moved.txt").size == len(TREE["a.txt"])
    assert read_whole(backend, "dir/sub/moved.txt") == TREE["a.txt"]
    # Onto an existing file: it is replaced.
    writer.rename("dir/z.txt", "dir/sub/c.txt")
    with pytest.raises(NotFound):
        backend.stat("dir/z.txt")
    assert read_whole(backend, "dir/sub/c.txt") == TREE["dir/z.txt"]
    assert names_in(backend, "dir/sub") == {"c.txt", "moved.txt"}
    assert names_in(backend, "dir") == {"b.bin", "sub"}


def test_rename_a_directory(store) -> None:
    writer = declared(store, writable, "writes")
    backend = store.backend
    writer.rename("dir", "moved")
    for gone in ("dir", "dir/b.bin", "dir/sub/c.txt"):
        with pytest.raises(NotFound):
            backend.stat(gone)
    assert backend.stat("moved").is_dir
    assert names_in(backend, "moved") == {"b.bin", "sub", "z.txt"}
    assert read_whole(backend, "moved/b.bin") == TREE["dir/b.bin"]
    assert read_whole(backend, "moved/sub/c.txt") == TREE["dir/sub/c.txt"]
    assert names_in(backend, "") == {"a.txt", "empty", "moved", "marker", "zeta"}
    # Onto an existing empty directory: it is replaced.
    writer.rename("zeta", "marker")
    with pytest.raises(NotFound):
        backend.stat("zeta")
    assert names_in(backend, "marker") == {"deep"}
    assert read_whole(backend, "marker/deep/er/file") == TREE["zeta/deep/er/file"]
    # An empty directory moves too.
    writer.make_dir("fresh")
    writer.rename("fresh", "renamed")
    with pytest.raises(NotFound):
        backend.stat("fresh")
    assert backend.stat("renamed").is_dir and list(backend.list("renamed")) == []
    assert names_in(backend, "") == {"a.txt", "empty", "moved", "marker", "renamed"}


# S3's smallest part but the last one.
PART = PART_LIMITS.min_size


def test_multipart_upload(store, tmp_path: Path) -> None:
    uploader = declared(store, multipart, "multipart")
    backend = store.backend
    data = random.Random(11).randbytes(PART + 123_457)
    local = staged(tmp_path, data)
    upload_id = uploader.begin_upload("dir/parts.bin")
    # The VFS sends parts in parallel, so they may arrive in any order: the etags' order counts.
    second = uploader.upload_part("dir/parts.bin", upload_id, 2, local, PART, len(data) - PART)
    first = uploader.upload_part("dir/parts.bin", upload_id, 1, local, 0, PART)
    with pytest.raises(NotFound):  # nothing shows before the upload is finished
        backend.stat("dir/parts.bin")
    info = uploader.finish_upload("dir/parts.bin", upload_id, [first, second], len(data))
    assert (info.name, info.size, info.is_dir) == ("parts.bin", len(data), False)
    assert info.version == backend.stat("dir/parts.bin").version
    for start, length in [(0, len(data)), (PART - 10, 20), (len(data) - 1, 1)]:
        got = backend.read_range("dir/parts.bin", start, length, info.version)
        assert got == data[start : start + length], (start, length)
    assert "parts.bin" in names_in(backend, "dir")


def test_multipart_replacing_and_aborted(store, tmp_path: Path) -> None:
    uploader = declared(store, multipart, "multipart")
    backend = store.backend
    local = staged(tmp_path, random.Random(13).randbytes(PART))
    upload_id = uploader.begin_upload("a.txt")
    etag = uploader.upload_part("a.txt", upload_id, 1, local, 0, PART)
    uploader.abort_upload("a.txt", upload_id)
    assert read_whole(backend, "a.txt") == TREE["a.txt"]  # what it would have replaced is intact
    with pytest.raises(PffsError):  # an aborted upload cannot be finished
        uploader.finish_upload("a.txt", upload_id, [etag], PART)
    assert read_whole(backend, "a.txt") == TREE["a.txt"]

    # A finished one replaces the object; a single part may be small.
    small = b"replaced in one part"
    upload_id = uploader.begin_upload("a.txt")
    etag = uploader.upload_part("a.txt", upload_id, 1, staged(tmp_path, small), 0, len(small))
    info = uploader.finish_upload("a.txt", upload_id, [etag], len(small))
    assert info.size == len(small) and info.version == backend.stat("a.txt").version
    assert read_whole(backend, "a.txt") == small
