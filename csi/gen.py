"""Regenerate the gRPC stubs from csi/proto/csi.proto: `python -m pffs.csi.gen`.

The stubs (csi_pb2.py, csi_pb2.pyi, csi_pb2_grpc.py) are committed so that a fresh clone and an
installed wheel work without a build step; tests/test_csi_stubs.py checks that they still match
the .proto. Needs grpcio-tools (in the `test` extra).
"""

from __future__ import annotations

import os
import sys
import tempfile
from importlib import resources
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_DIR = HERE / "proto"
STUBS = ("csi_pb2.py", "csi_pb2.pyi", "csi_pb2_grpc.py")
# protoc writes a top-level import; the stubs live in the package pffs.csi.
TOP_LEVEL_IMPORT = "import csi_pb2 as csi__pb2"
PACKAGE_IMPORT = "from pffs.csi import csi_pb2 as csi__pb2"


def generate(out_dir: Path) -> list[Path]:
    """Compile csi.proto into `out_dir`; returns the files written."""
    from grpc_tools import protoc

    well_known = resources.files("grpc_tools") / "_proto"
    argv = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        "csi.proto",
    ]
    if protoc.main(argv) != 0:
        raise RuntimeError("protoc failed on csi/proto/csi.proto")
    grpc_stub = out_dir / "csi_pb2_grpc.py"
    text = grpc_stub.read_text(encoding="utf-8")
    if TOP_LEVEL_IMPORT not in text:
        raise RuntimeError(f"unexpected import line in the generated {grpc_stub.name}")
    grpc_stub.write_text(text.replace(TOP_LEVEL_IMPORT, PACKAGE_IMPORT), encoding="utf-8")
    return [out_dir / name for name in STUBS]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            os.replace(path, HERE / path.name)
            print(f"wrote {HERE / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
