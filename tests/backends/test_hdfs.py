"""HDFS: what libhdfs needs is found or named in one line; URL parsing.

There is no Hadoop on this machine: the missing-libhdfs errors are tested for real (against this
machine's Java, and against Hadoop-shaped directories made here), and the contract suite runs
against a real cluster only where PFFS_TEST_HDFS_URI is set (see tests/backends/stores.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pffs.backends.hdfs import LibhdfsMissing, find_libhdfs_problem, parse_hdfs_url
from tests.conftest import run_pffs


def _fake_java(tmp_path: Path) -> Path:
    home = tmp_path / "jdk"
    (home / "lib" / "server").mkdir(parents=True)
    (home / "lib" / "server" / "libjvm.so").write_bytes(b"")
    (home / "bin").mkdir()
    return home


def _fake_hadoop(tmp_path: Path, script: str | None) -> Path:
    home = tmp_path / "hadoop"
    (home / "lib" / "native").mkdir(parents=True)
    (home / "lib" / "native" / "libhdfs.so").write_bytes(b"")
    if script is not None:
        (home / "bin").mkdir()
        (home / "bin" / "hadoop").write_text(f"#!/bin/sh\n{script}\n")
        (home / "bin" / "hadoop").chmod(0o755)
    return home


def no_command(name: str) -> str | None:
    return None


def test_no_java_names_java_home() -> None:
    with pytest.raises(LibhdfsMissing, match="JAVA_HOME"):
        find_libhdfs_problem({}, which=no_command)


def test_java_home_without_libjvm(tmp_path: Path) -> None:
    with pytest.raises(LibhdfsMissing, match=r"libjvm\.so, not found under JAVA_HOME"):
        find_libhdfs_problem({"JAVA_HOME": str(tmp_path)}, which=no_command)


def test_java_home_is_found_from_path_then_libhdfs_is_missing() -> None:
    java = shutil.which("java")
    if java is None:
        pytest.skip("no java on this machine")
    env: dict[str, str] = {}
    with pytest.raises(LibhdfsMissing, match=r"HADOOP_HOME.*ARROW_LIBHDFS_DIR") as caught:
        find_libhdfs_problem(env, which=lambda name: java if name == "java" else None)
    assert env["JAVA_HOME"]  # derived from the java on PATH, as the Hadoop scripts do
    assert "\n" not in str(caught.value)


def test_libhdfs_without_hadoop_command_names_classpath(tmp_path: Path) -> None:
    env = {
        "JAVA_HOME": str(_fake_java(tmp_path)),
        "ARROW_LIBHDFS_DIR": str(_fake_hadoop(tmp_path, None) / "lib" / "native"),
    }
    with pytest.raises(LibhdfsMissing, match=r"CLASSPATH=\$\(hadoop classpath --glob\)"):
        find_libhdfs_problem(env, which=no_command)


def test_classpath_comes_from_hadoop_classpath(tmp_path: Path) -> None:
    hadoop = _fake_hadoop(tmp_path, 'echo "/opt/hadoop/share/hadoop/common/a.jar:/conf"')
    env = {"JAVA_HOME": str(_fake_java(tmp_path)), "HADOOP_HOME": str(hadoop)}
    find_libhdfs_problem(env, which=no_command)
    assert env["CLASSPATH"] == "/opt/hadoop/share/hadoop/common/a.jar:/conf"


def test_failing_hadoop_command_is_reported(tmp_path: Path) -> None:
    hadoop = _fake_hadoop(tmp_path, 'echo "Error: JAVA_HOME is incorrectly set" >&2; exit 1')
    env = {"JAVA_HOME": str(_fake_java(tmp_path)), "HADOOP_HOME": str(hadoop)}
    with pytest.raises(LibhdfsMissing, match="JAVA_HOME is incorrectly set"):
        find_libhdfs_problem(env, which=no_command)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("hdfs://nn:9000/data/x", ("nn", 9000, "/data/x")),
        ("hdfs://nn/data/", ("nn", 8020, "/data")),
        ("hdfs:///data", ("default", 0, "/data")),
        ("hdfs://nn", ("nn", 8020, "/")),
    ],
)
def test_parse_hdfs_url(url: str, expected: tuple[str, int, str]) -> None:
    assert parse_hdfs_url(url) == expected


def test_mount_of_hdfs_without_hadoop_fails_in_one_line(tmp_path: Path) -> None:
    if shutil.which("hadoop"):
        pytest.skip("Hadoop is installed here; this checks the error where it is not")
    (tmp_path / "mnt").mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "HADOOP_HOME": "",
        "ARROW_LIBHDFS_DIR": "",
        "HOME": str(tmp_path),
    }
    result = run_pffs(
        "mount", "hdfs://namenode:8020/data", str(tmp_path / "mnt"), env={**os.environ, **env}
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "HADOOP_HOME" in result.stderr or "JAVA_HOME" in result.stderr
    assert "Traceback" not in result.stderr
