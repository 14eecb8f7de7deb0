"""What a backend declares in its `capabilities` is what it implements: a capability a store
implements must be declared, one it declares must be implemented, and the accessors follow the
declaration.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from pffs.backends import REGISTRY, Backend, scheme_of
from pffs.backends.arrow import ArrowLocalBackend
from pffs.backends.base import (
    BlockRunReader,
    Capabilities,
    MultipartBackend,
    TreeLister,
    WritableBackend,
    Writing,
    block_runs,
    multipart,
    tree_lister,
    writable,
)
from pffs.backends.hdfs import HdfsBackend
from pffs.backends.local import LocalBackend
from pffs.backends.principal import local_principal
from pffs.backends.s3 import S3Backend
from pffs.backends.s3writes import PART_LIMITS
from pffs.config import SourceConfig

# --- declared capabilities ------------------------------------------------------------------

CAPABILITY_METHODS = {
    "writes": ("put", "delete", "make_dir", "remove_dir", "rename"),
    "multipart": ("begin_upload", "upload_part", "finish_upload", "abort_upload"),
    "block_runs": ("read_blocks",),
    "tree_pages": ("list_tree",),
}
# Each capability: its accessor, and the protocol of the methods it promises.
CAPABILITIES: dict[str, tuple[Callable[[Backend], object], type]] = {
    "writes": (writable, WritableBackend),
    "multipart": (multipart, MultipartBackend),
    "block_runs": (block_runs, BlockRunReader),
    "tree_pages": (tree_lister, TreeLister),
}
BACKEND_CLASSES = [S3Backend, LocalBackend, ArrowLocalBackend, HdfsBackend]


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    """The methods `protocol` adds to the protocols it extends, with their signatures."""
    return {
        name: inspect.signature(value)
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


def _defined(cls: type, name: str) -> object:
    """What `cls` or one of its bases defines as `name`, or None (nothing is called)."""
    return next((vars(klass)[name] for klass in cls.__mro__ if name in vars(klass)), None)


def _parameters(signature: inspect.Signature) -> list[tuple[str, object, object]]:
    """Names, kinds and defaults: what a caller passing arguments by name depends on."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_every_capability_is_covered() -> None:
    """A new Capabilities field needs its accessor and protocol here, and tests above."""
    assert {field.name for field in dataclasses.fields(Capabilities)} == set(CAPABILITIES)
    for capability, (_, protocol) in CAPABILITIES.items():
        assert set(_methods(protocol)) == set(CAPABILITY_METHODS[capability])
    # A store with parts takes writes too: MultipartBackend is a WritableBackend.
    with pytest.raises(ValueError, match="multipart"):
        Capabilities(multipart=PART_LIMITS)


def test_part_limits_size_the_parts_of_an_upload() -> None:
    """The part size staging asks for, grown where S3's rules require it, refused past them."""
    preferred = 8 << 20
    assert PART_LIMITS.part_size(0, preferred) == preferred  # a streamed upload: size unknown
    assert PART_LIMITS.part_size(0, 1 << 20) == 5 << 20  # never below the store's minimum
    big = 200 << 30  # 200 GiB: 10,000 parts of 8 MiB would not hold it
    size = PART_LIMITS.part_size(big, preferred)
    assert size * PART_LIMITS.max_count >= big > (size - 1) * PART_LIMITS.max_count
    with pytest.raises(ValueError, match="larger than"):
        PART_LIMITS.part_size(PART_LIMITS.max_size * PART_LIMITS.max_count + 1, preferred)


def _implementer(backend_class: type, capability: str) -> type | None:
    """The class whose methods a capability promises: the backend's own, or for writes and
    parts its writer's (the class's annotation of `writer`; None where it has none)."""
    if capability in ("writes", "multipart"):
        writer: type | None = typing.get_type_hints(backend_class).get("writer")
        return writer
    return backend_class


@pytest.mark.parametrize("backend_class", BACKEND_CLASSES, ids=lambda c: c.__name__)
def test_declared_capabilities_are_implemented(backend_class: type[Backend]) -> None:
    """A declared capability's methods exist, with the protocol's parameters; an undeclared
    one's do not, so nothing a store can do goes undeclared. What a store declares is all
    callers look at."""
    declared = backend_class.capabilities
    assert isinstance(declared, Capabilities)
    flags = dataclasses.asdict(declared)
    promised: list[tuple[bool, str, type]] = [(True, "reads", Backend)]
    promised += [(bool(flags[c]), c, protocol) for c, (_, protocol) in CAPABILITIES.items()]
    for is_declared, capability, protocol in promised:
        owner = _implementer(backend_class, capability)
        for name, signature in _methods(protocol).items():
            method = None if owner is None else _defined(owner, name)
            if not is_declared:
                assert method is None, f"{name} is implemented but {capability} is not declared"
                continue
            assert inspect.isfunction(method) and callable(method), (capability, name)
            assert _parameters(inspect.signature(method)) == _parameters(signature), name
    # No forwarding wall: where an object of its own takes the writes, the backend has none.
    writer_class = _implementer(backend_class, "writes")
    if writer_class is not None and not issubclass(backend_class, writer_class):
        assert all(_defined(backend_class, name) is None for name in CAPABILITY_METHODS["writes"])
    assert declared.multipart is None or declared.writes


def test_accessors_give_what_is_declared(store) -> None:
    """Each accessor gives the backend itself (block runs) or its writer (writes, parts) where
    its class declares the capability, None elsewhere; the rest of what every backend carries is
    there too."""
    backend = store.backend
    assert backend.capabilities is type(backend).capabilities  # declared by the class
    flags = dataclasses.asdict(backend.capabilities)
    for capability, (accessor, _) in CAPABILITIES.items():
        view = cast(Writing, backend).writer if capability in ("writes", "multipart") else backend
        assert accessor(backend) is (view if flags[capability] else None), capability
    assert isinstance(backend.source_id, str) and backend.source_id
    assert isinstance(backend.max_concurrency, int) and backend.max_concurrency > 0
    assert backend.retries == 0  # a counter, and nothing has been retried yet


def test_accessors_follow_the_declaration(tmp_path: Path) -> None:
    local = LocalBackend(SourceConfig(url=f"file://{tmp_path}"))
    assert writable(local) is local
    assert multipart(local) is None and block_runs(local) is None and tree_lister(local) is None
    s3 = S3Backend(SourceConfig(url="s3://bucket", endpoint_url="http://127.0.0.1:1"))
    assert writable(s3) is s3.writer and multipart(s3) is s3.writer and block_runs(s3) is s3
    assert tree_lister(s3) is s3
    assert s3.capabilities.multipart == PART_LIMITS


def test_the_registry_marks_each_store_that_reads_this_machines_files(store) -> None:
    """A store read as this process's user (its files, the kernel checks) is marked
    `node_files` in the registry, which front ends hold to the directories they allow
    (Fluid's --allow-local); one that is not, is not."""
    backend = store.backend
    entry = REGISTRY[scheme_of(backend.source_id)]
    assert entry.node_files == (backend.principal == local_principal())
