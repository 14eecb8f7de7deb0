"""A one-node Ceph with a RADOS Gateway on 127.0.0.1: a real production S3 server for the
tests and the bench.

One monitor, one OSD (memstore, its data in RAM; or BlueStore on a file), no manager (S3 needs
none) and one gateway, each a plain foreground process of ours in a session of its own, with
every file (config, data, sockets, logs) under one directory, each dying with the thread that
started it (PR_SET_PDEATHSIG), so that a test or bench killed outright leaves no daemon behind.
The steps are those of Ceph's own src/vstart.sh: a monitor map, `ceph-mon --mkfs`, `ceph osd
create`, `ceph-osd --mkfs`, then the gateway, which creates its pools itself. Stopping is
SIGKILL: memstore writes its whole store to disk on a clean shutdown, and nothing of it is
wanted afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Self

from pffs.testing.servers import free_port

# What a one-node cluster needs, as Debian names the packages.
CEPH_PACKAGES = ("ceph-mon", "ceph-osd", "ceph-mgr", "radosgw", "ceph-common")
_BINARIES = ("ceph", "ceph-mon", "ceph-osd", "monmaptool", "radosgw", "radosgw-admin")
OBJECTSTORES = ("memstore", "bluestore")
# The OSD's size. For memstore a cap, not an allocation: it keeps objects in RAM as they are
# written (deleted ones until the gateway's collector runs, a minute or two later).
MEMSTORE_BYTES = 8 << 30
BLUESTORE_BYTES = 32 << 30  # a sparse file
START_TIMEOUT_S = 90.0
ADMIN_TIMEOUT_S = 60.0
GATEWAY_NAME = "client.rgw.pffs"
_PR_SET_PDEATHSIG = 1  # prctl(2)
_libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child between fork and exec must
# only call it (a dlopen there could wait on a lock another thread of the parent held)


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A preexec_fn: the child is sent SIGKILL when the thread that forked it ends, as when the
    process holding the cluster is killed (a stop by signal that no `finally` sees). Checked
    against `parent`, the forking process's pid, for a parent gone before the prctl."""

    def preexec() -> None:
        if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != parent:
            os._exit(1)  # no guard, or no parent left: this child must not run on

    return preexec


class RgwUnavailable(Exception):
    """Ceph cannot run here or the cluster did not come up; the message says why."""


def missing_binaries() -> list[str]:
    """The Ceph commands a cluster needs that are not on PATH."""
    return [name for name in _BINARIES if shutil.which(name) is None]


def _config(directory: Path, mon_ports: tuple[int, int], port: int, objectstore: str) -> str:
    d = directory
    store = (
        f"memstore device bytes = {MEMSTORE_BYTES}"
        if objectstore == "memstore"
        else f"bluestore block create = true\nbluestore block size = {BLUESTORE_BYTES}"
    )
    return f"""[global]
fsid = {uuid.uuid4()}
mon host = [v2:127.0.0.1:{mon_ports[0]},v1:127.0.0.1:{mon_ports[1]}]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
run dir = {d}/run
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
mon cluster log file = {d}/log/cluster.log
crash dir = {d}/crash
keyring = {d}/keyring
auth cluster required = none
auth service required = none
auth client required = none
# radosgw asks the monitor for secure mode by default, which needs auth.
ms mon client mode = crc
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
# the gateway's 7 pools of 8 PGs would pass the default 250 on one OSD
mon max pg per osd = 1000
mon data avail crit = 1
client mount timeout = 30
[mon]
mon data = {d}/$name
# A change of the maps is proposed at once, not batched for a second: the gateway makes its
# pools one after another, each waiting for a proposal (most of a start otherwise).
paxos propose interval = 0.05
[osd]
osd data = {d}/$name
osd objectstore = {objectstore}
{store}
[{GATEWAY_NAME}]
rgw data = {d}/rgw
rgw frontends = beast endpoint=127.0.0.1:{port}
rgw relaxed region enforcement = true
# deleted objects' data is collected after a minute, not the default two hours
rgw gc obj min wait = 60
rgw init timeout = {int(START_TIMEOUT_S)}
"""


class RgwCluster:
    """A running one-node Ceph with a gateway; `with RgwCluster.start(dir) as rgw: ...`."""

    def __init__(
        self,
        directory: Path,
        port: int,
        on_spawn: Callable[[subprocess.Popen[bytes]], None] | None = None,
    ) -> None:
        self.directory = directory
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.admin_keys: tuple[str, str] = ("", "")
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._on_spawn = on_spawn
        self._env = {**os.environ, "CEPH_CONF": str(directory / "ceph.conf")}

    @classmethod
    def start(
        cls,
        directory: Path,
        *,
        port: int | None = None,
        objectstore: str = "memstore",
        on_spawn: Callable[[subprocess.Popen[bytes]], None] | None = None,
    ) -> RgwCluster:
        """Start a cluster whose every file is under `directory` (created; removed by stop).
        `on_spawn` is told of each daemon the moment it starts (the bench records them). Call
        it (and start_gateway) from a thread that outlives the cluster, such as the main
        thread: the daemons die with the thread that started them."""
        if objectstore not in OBJECTSTORES:
            raise ValueError(f"objectstore {objectstore!r}: one of {', '.join(OBJECTSTORES)}")
        missing = missing_binaries()
        if missing:
            raise RgwUnavailable(
                f"Ceph is not installed ({', '.join(missing)} missing; apt-get install "
                f"--no-install-recommends {' '.join(CEPH_PACKAGES)})"
            )
        directory = Path(directory).absolute()
        cluster = cls(directory, port or free_port(), on_spawn)
        try:
            cluster._bootstrap(objectstore)
        except BaseException:  # Ctrl-C or SIGTERM mid-start leaves nothing behind either
            cluster.stop()
            raise
        return cluster

    def _bootstrap(self, objectstore: str) -> None:
        d = self.directory
        for sub in ("run", "log", "crash", "rgw", "mon.a", "osd.0"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        mon_ports = (free_port(), free_port())
        (d / "ceph.conf").write_text(_config(d, mon_ports, self.port, objectstore))
        keyring, monmap = str(d / "keyring"), str(d / "monmap")
        self._run("ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.")
        self._run("ceph-authtool", keyring, "--gen-key", "-n", "client.admin")
        self._run("monmaptool", "--create", "--clobber", "--fsid", self._fsid(), monmap)
        self._run(
            "monmaptool",
            monmap,
            "--addv",
            "a",
            f"[v2:127.0.0.1:{mon_ports[0]},v1:127.0.0.1:{mon_ports[1]}]",
        )
        self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring)
        self._spawn("mon.a", "ceph-mon", "-f", "-i", "a")
        osd_id = self._ceph("osd", "create").strip()
        if osd_id != "0":
            raise RgwUnavailable(f"`ceph osd create` gave {osd_id!r}, not 0")
        self._ceph("osd", "crush", "add", "osd.0", "1", "root=default")
        self._run("ceph-osd", "-i", "0", "--mkfs")
        self._spawn("osd.0", "ceph-osd", "-f", "-i", "0")
        self._spawn("rgw", "radosgw", "-f", "-n", GATEWAY_NAME)
        self._wait_for_gateway()
        self.admin_keys = self.create_user("pffs-admin")

    def _fsid(self) -> str:
        for line in (self.directory / "ceph.conf").read_text().splitlines():
            if line.startswith("fsid = "):
                return line.removeprefix("fsid = ")
        raise AssertionError("ceph.conf has no fsid")

    def _run(self, *argv: str, timeout: float = ADMIN_TIMEOUT_S) -> str:
        """Run a Ceph command to completion; its output, or RgwUnavailable with its error."""
        try:
            result = subprocess.run(
                argv,
                env=self._env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                preexec_fn=_die_with_parent(os.getpid()),
            )
        except subprocess.TimeoutExpired:
            raise RgwUnavailable(f"`{' '.join(argv[:3])}` took over {timeout:.0f}s") from None
        if result.returncode != 0:
            error = (result.stderr.strip() or result.stdout.strip()).splitlines()
            raise RgwUnavailable(
                f"`{' '.join(argv[:3])}` failed: {error[-1] if error else result.returncode}"
            )
        return result.stdout

    def _ceph(self, *argv: str) -> str:
        return self._run("ceph", "--connect-timeout", "30", *argv)

    def _spawn(self, name: str, *argv: str) -> None:
        with open(self.directory / "log" / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(
                argv,
                env=self._env,
                stdout=out,
                stderr=out,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )
        self.processes[name] = proc
        if self._on_spawn is not None:
            self._on_spawn(proc)

    def _wait_for_gateway(self) -> None:
        """Wait until the gateway answers S3 (it does once its pools exist, so once the OSD is
        up); a daemon that died meanwhile ends the wait with its log's last line."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RgwUnavailable(
                        f"ceph {name} exited {proc.returncode}: {self._tail(name)}"
                    )
            if self._answers():
                return
            time.sleep(0.2)
        raise RgwUnavailable(
            f"the gateway did not answer on {self.endpoint} in {START_TIMEOUT_S:.0f}s: "
            f"{self._tail('rgw')}"
        )

    def _answers(self) -> bool:
        """Whether the gateway answers an anonymous listing of buckets, as S3 does (something
        else on the port would not)."""
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=1.0) as response:
                return b"ListAllMyBucketsResult" in response.read(4096)
        except (OSError, ValueError):
            return False

    def _tail(self, name: str) -> str:
        """The last line of a daemon's own log (or of its output), for an error message."""
        log_name = {"rgw": GATEWAY_NAME}.get(name, name)
        for path in (
            self.directory / "log" / f"{log_name}.log",
            self.directory / "log" / f"{name}.out",
        ):
            try:
                lines = path.read_text(errors="replace").strip().splitlines()
            except OSError:
                continue
            if lines:
                return lines[-1][-300:]
        return "(no log)"

    def create_user(self, uid: str, *, keys: tuple[str, str] | None = None) -> tuple[str, str]:
        """A new gateway user (`radosgw-admin user create`); its access and secret keys, made
        up unless `keys` gives them."""
        access, secret = keys or (f"{uid[:8]}{secrets.token_hex(6)}", secrets.token_hex(20))
        out = self._run(
            "radosgw-admin",
            "user",
            "create",
            f"--uid={uid}",
            f"--display-name={uid}",
            f"--access-key={access}",
            f"--secret-key={secret}",
        )
        created = json.loads(out)["keys"][0]
        return str(created["access_key"]), str(created["secret_key"])

    def kill_gateway(self) -> None:
        """SIGKILL the gateway alone, as a crash of the S3 server; the cluster stays up."""
        gateway = self.processes.pop("rgw")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(gateway.pid, signal.SIGKILL)
        gateway.wait()

    def start_gateway(self) -> None:
        """Start the gateway again (after kill_gateway), on its port; return once it answers."""
        self._spawn("rgw", "radosgw", "-f", "-n", GATEWAY_NAME)
        self._wait_for_gateway()

    def pids(self) -> dict[str, int]:
        """The process id of each running daemon, by name (mon.a, osd.0, rgw)."""
        return {name: p.pid for name, p in self.processes.items() if p.poll() is None}

    def stop(self) -> None:
        """SIGKILL every daemon, wait for each, then remove the directory."""
        for proc in self.processes.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.processes.values():
            proc.wait()
        self.processes.clear()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
