"""Regenerate the gRPC stubs in this folder from csi.proto: `./dev.sh proto`.

That is `python -m pffs.csi.proto.generate`. The stubs (csi_pb2.py, csi_pb2.pyi, csi_pb2_grpc.py)
are committed so that a fresh clone and an installed wheel work without a build step;
tests/csi/test_stubs.py checks that they still match what this generator makes. Needs
grpcio-tools (in the `test` extra).
"""

from __future__ import annotations

import os
import sys
import tempfile
from importlib import resources
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "csi.proto"
STUBS = ("csi_pb2.py", "csi_pb2.pyi", "csi_pb2_grpc.py")
# The package the stubs live in, as the driver imports them.
PACKAGE = "pffs.csi.proto"
# protoc names the messages' module after the .proto's path under the include directory
# (-I HERE): a top-level `csi_pb2`. Only the import in csi_pb2_grpc.py depends on that; it is
# rewritten to the package. The message stubs stay as protoc writes them, so the descriptor
# keeps its file name `csi.proto`.
TOP_LEVEL_IMPORT = "import csi_pb2 as csi__pb2"
PACKAGE_IMPORT = f"from {PACKAGE} import csi_pb2 as csi__pb2"


def generate(out_dir: Path) -> list[Path]:
    """Compile csi.proto into `out_dir`; returns the files written."""
    from grpc_tools import protoc

    well_known = resources.files("grpc_tools") / "_proto"
    argv = [
        "grpc_tools.protoc",
        f"-I{HERE}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        PROTO.name,
    ]
    if protoc.main(argv) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    grpc_stub = out_dir / "csi_pb2_grpc.py"
    text = grpc_stub.read_text(encoding="utf-8")
    if text.count(TOP_LEVEL_IMPORT) != 1:
        raise RuntimeError(f"unexpected import line in the generated {grpc_stub.name}")
    grpc_stub.write_text(text.replace(TOP_LEVEL_IMPORT, PACKAGE_IMPORT), encoding="utf-8")
    return [out_dir / name for name in STUBS]


def main() -> int:
    """Write fresh stubs next to csi.proto (each replaced in one step)."""
    # Generated beside the stubs, so that os.replace never crosses file systems.
    with tempfile.TemporaryDirectory(dir=HERE, prefix=".generate-") as tmp:
        for path in generate(Path(tmp)):
            os.replace(path, HERE / path.name)
            print(f"wrote {HERE / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
