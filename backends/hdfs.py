"""HDFS through pyarrow's HadoopFileSystem (libhdfs + a JVM): `hdfs://namenode[:port]/path`.

Everything but the connect call is the generic arrow backend. libhdfs needs a JVM (JAVA_HOME),
libhdfs.so (HADOOP_HOME/lib/native or ARROW_LIBHDFS_DIR) and the Hadoop jars on CLASSPATH
(`hadoop classpath --glob`). When one is missing, arrow fails deep inside the JVM with a stack
trace; `find_libhdfs_problem` looks first and names what is missing and how to fix it, in one
line. `hdfs:///path` (no namenode) uses fs.defaultFS from the Hadoop configuration.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Callable, MutableMapping
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs

from pffs.backends.arrow import ArrowBackend
from pffs.backends.base import WritableBackend
from pffs.backends.principal import hdfs_principal
from pffs.config import SourceConfig
from pffs.errors import BackendError, UsageError

DEFAULT_PORT = 8020
# Where a JDK or JRE keeps libjvm.so, relative to JAVA_HOME (Java 9+, then Java 8 layouts).
_LIBJVM_PATTERNS = ("lib/server/libjvm.so", "jre/lib/*/server/libjvm.so", "lib/*/server/libjvm.so")


class LibhdfsMissing(UsageError):
    """What libhdfs needs is not on this machine; the message says what and how to fix it."""


def find_libhdfs_problem(
    env: MutableMapping[str, str],
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[[list[str]], str] | None = None,
) -> None:
    """Check (and where possible complete) what libhdfs needs in `env`; raise LibhdfsMissing.

    Fills in JAVA_HOME from the `java` on PATH, and CLASSPATH from `hadoop classpath --glob`,
    as the Hadoop scripts would.
    """
    run = run or _run_hadoop
    java_home = env.get("JAVA_HOME")
    if not java_home:
        java = which("java")
        if java is None:
            raise LibhdfsMissing(
                "hdfs:// needs Java: set JAVA_HOME to a JDK or JRE "
                "(e.g. apt-get install openjdk-17-jre-headless)"
            )
        # .../jvm/java-17/bin/java -> .../jvm/java-17
        java_home = os.path.dirname(os.path.dirname(os.path.realpath(java)))
        env["JAVA_HOME"] = java_home
    if not _find(java_home, _LIBJVM_PATTERNS):
        raise LibhdfsMissing(
            f"hdfs:// needs libjvm.so, not found under JAVA_HOME={java_home}: "
            "point JAVA_HOME at a JDK or JRE"
        )

    hadoop_home = env.get("HADOOP_HOME")
    libhdfs_dirs = [env["ARROW_LIBHDFS_DIR"]] if env.get("ARROW_LIBHDFS_DIR") else []
    if hadoop_home:
        libhdfs_dirs.append(os.path.join(hadoop_home, "lib", "native"))
    if not any(os.path.exists(os.path.join(d, "libhdfs.so")) for d in libhdfs_dirs):
        found = f"not in {', '.join(libhdfs_dirs)}" if libhdfs_dirs else "no HADOOP_HOME set"
        raise LibhdfsMissing(
            f"hdfs:// needs libhdfs.so ({found}): set HADOOP_HOME to a Hadoop "
            "installation, or ARROW_LIBHDFS_DIR to the directory holding libhdfs.so"
        )

    if "hadoop" not in env.get("CLASSPATH", "").lower():
        hadoop = os.path.join(hadoop_home, "bin", "hadoop") if hadoop_home else None
        if hadoop is None or not os.access(hadoop, os.X_OK):
            hadoop = which("hadoop")
        if hadoop is None:
            raise LibhdfsMissing(
                "hdfs:// needs the Hadoop jars on CLASSPATH: set CLASSPATH=$(hadoop classpath "
                "--glob), or HADOOP_HOME so pffs can run bin/hadoop itself"
            )
        env["CLASSPATH"] = run([hadoop, "classpath", "--glob"])


def _find(base: str, patterns: tuple[str, ...]) -> str | None:
    for pattern in patterns:
        found = glob.glob(os.path.join(base, pattern))
        if found:
            return found[0]
    return None


def _run_hadoop(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LibhdfsMissing(f"`{' '.join(argv)}` failed: {exc}") from None
    if done.returncode != 0 or not done.stdout.strip():
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise LibhdfsMissing(f"`{' '.join(argv)}` failed ({reason}): is HADOOP_HOME right?")
    return done.stdout.strip()


def parse_hdfs_url(url: str) -> tuple[str, int, str]:
    """(host, port, root path) of hdfs://namenode[:port]/path; host 'default' without one."""
    parts = urlsplit(url)
    if parts.scheme != "hdfs" or parts.query or parts.fragment:
        raise UsageError(f"malformed URL {url!r}: use hdfs://namenode[:port]/path")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise UsageError(f"malformed URL {url!r}: the port is not a number") from None
    path = "/" + unquote(parts.path).strip("/")
    if any(part in (".", "..") for part in path.split("/")):
        raise UsageError(f"malformed URL {url!r}: the path has '.' or '..' parts")
    if not parts.hostname:  # the configuration's fs.defaultFS (port 0: its own, or HA)
        return "default", 0, path
    return parts.hostname, port, path


class HdfsBackend(ArrowBackend):
    """hdfs://namenode[:port]/path"""

    def __init__(self, source: SourceConfig, env: MutableMapping[str, str] | None = None) -> None:
        self.host, self.port, root = parse_hdfs_url(source.url)
        namenode = self.host if self.host == "default" else f"{self.host}:{self.port}"
        self._env = os.environ if env is None else env
        principal = hdfs_principal(source.hdfs_user, source.kerberos_ticket_cache, self._env)
        super().__init__(source, root, f"hdfs://{namenode}{root}".rstrip("/"), principal)

    def _connect(self) -> pafs.FileSystem:
        find_libhdfs_problem(self._env)
        options: dict[str, object] = {"user": self.source.hdfs_user}
        if self.source.kerberos_ticket_cache:
            options["kerb_ticket"] = self.source.kerberos_ticket_cache
        if self.source.replication:
            options["replication"] = self.source.replication
        if self.source.buffer_size:
            options["buffer_size"] = self.source.buffer_size
        try:
            return pafs.HadoopFileSystem(self.host, self.port, **options)
        except OSError as exc:
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise BackendError(
                f"cannot connect to HDFS at {self.host}:{self.port}: {first_line}"
            ) from None


# What HdfsBackend declares (ArrowBackend's), checked by mypy.
_HDFS: type[WritableBackend] = HdfsBackend
