"""`pffs fluid` as Fluid runs it: a config file as the controller writes it, a real mount of an
S3 prefix (moto on 127.0.0.1, keys only in secret files) and a local directory, SIGTERM, a
dead mount left by a killed container, the liveness check and a changed config."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pffs.jobs import preload_order
from pffs.mounting.kernel import FSTYPE, MountEntry, mount_table, wait_unmounted
from pffs.testing.servers import DUMMY_CREDENTIALS, MotoServer
from tests.conftest import PFFS, run_pffs
from tests.fluid_controller import fluid_config, write_secret
from tests.fusecheck import clear_mount, is_dead, serves
from tests.waiting import eventually

pytestmark = pytest.mark.mount

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


def encrypt(name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": key}}}


@pytest.fixture
def fluid(tmp_path: Path, moto: MotoServer, s3, bucket: str) -> dict[str, Any]:
    """A Dataset of two mounts as Fluid's config file, and where things are."""
    s3.put_object(Bucket=bucket, Key="imagenet/train/shard-0.tar", Body=PAYLOAD)
    local = tmp_path / "labels"
    local.mkdir()
    (local / "classes.txt").write_text("cat\ndog\n")
    secrets = tmp_path / "secrets"
    write_secret(
        secrets,
        "s3-keys",
        {
            "accessKeyId": DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secretAccessKey": DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        },
    )
    dataset = {
        "sharedOptions": {"metadata-ttl": "30"},
        "mounts": [
            {
                "mountPoint": f"s3://{bucket}/imagenet",
                "name": "imagenet",
                "options": {"endpoint-url": moto.endpoint_url},
                "encryptOptions": [
                    encrypt("access-key-id", "accessKeyId"),
                    encrypt("secret-access-key", "secretAccessKey"),
                ],
            },
            {"mountPoint": f"local://{local}", "name": "labels"},
        ],
    }
    target = tmp_path / "runtime-mnt" / "thin" / "default" / "imagenet" / "thin-fuse"
    runtime = {"preload": "on"}
    config = tmp_path / "config.json"
    config.write_text(fluid_config(dataset, str(target), secrets, runtime))
    # The profile's command line: the cache, the secrets, the node directories allowed.
    options = f"cache-dir={tmp_path / 'cache'},cache-size=1G"
    if os.geteuid() != 0:  # as in Fluid, allow_other; a user needs user_allow_other for it
        options += ",allow-other=false"
    profile = ["--options", options, "--secrets-dir", str(secrets), "--allow-local", str(local)]
    return {
        "config": config,
        "target": target,
        "dataset": dataset,
        "secrets": secrets,
        "profile": profile,
    }


def container_env() -> dict[str, str]:
    """The container's environment: no AWS keys (they come from the secret files)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return env | {"FLUID_RUNTIME_TYPE": "thin", "FLUID_RUNTIME_NS": "default"}


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `pffs fluid` and wait for its mount; every process is stopped at the end."""
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def _start(fluid: dict[str, Any], *extra: str) -> subprocess.Popen[bytes]:
        config, target = fluid["config"], fluid["target"]
        log = open(tmp_path / f"fluid-{len(started)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [*PFFS, "fluid", "--config", str(config), *fluid["profile"], *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=container_env(),
        )
        log.close()
        started.append((proc, target))

        def serving() -> bool:
            assert proc.poll() is None, _log(tmp_path, len(started) - 1)
            return serves(target)

        eventually(serving, 60, "the mount")
        return proc

    yield _start
    for proc, target in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        clear_mount(target)


def _log(tmp_path: Path, index: int) -> str:
    return (tmp_path / f"fluid-{index}.log").read_text()


def check(config: Path) -> subprocess.CompletedProcess[str]:
    return run_pffs("fluid", "--check", "--config", str(config), env=container_env())


def test_serves_the_dataset_and_unmounts_on_sigterm(fluid: dict[str, Any], start) -> None:
    target = fluid["target"]
    assert not target.exists()  # pffs fluid makes it
    proc = start(fluid)
    assert (target / "imagenet" / "train" / "shard-0.tar").read_bytes() == PAYLOAD
    assert (target / "labels" / "classes.txt").read_text() == "cat\ndog\n"
    assert sorted(os.listdir(target)) == ["imagenet", "labels"]
    with pytest.raises(OSError) as refused:  # ReadOnlyMany, Fluid's default
        (target / "labels" / "new.txt").write_text("x")
    assert refused.value.errno == 30  # EROFS
    result = check(fluid["config"])
    assert result.returncode == 0 and "is live" in result.stdout

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert wait_unmounted(str(target), timeout=5)
    result = check(fluid["config"])
    assert result.returncode == 1 and "no pffs mount" in result.stdout


def test_clears_a_dead_mount_left_by_a_killed_container(fluid: dict[str, Any], start) -> None:
    target = fluid["target"]
    start(fluid).kill()  # kill -9: the kernel mount stays, dead
    eventually(lambda: is_dead(target), 10, "the killed mount dead")
    result = check(fluid["config"])
    assert result.returncode == 1 and "dead" in result.stdout

    proc = start(fluid)  # the restarted container
    assert (target / "labels" / "classes.txt").read_text() == "cat\ndog\n"
    assert [e.fstype for e in _mounts_at(target)] == [FSTYPE]  # replaced, not stacked
    proc.terminate()
    assert proc.wait(timeout=60) == 0


def _mounts_at(target: Path) -> list[MountEntry]:
    return [e for e in mount_table() if e.mountpoint == str(target)]


def test_a_changed_config_exits_9_and_a_broken_one_is_ignored(
    fluid: dict[str, Any], start, tmp_path: Path
) -> None:
    config, target = fluid["config"], fluid["target"]
    proc = start(fluid, "--watch-interval", "0.2")
    text = config.read_text()
    config.write_text(text[:-10])  # torn: logged, still serving
    torn_seen = lambda: "cannot be used, still serving" in _log(tmp_path, 0)  # noqa: E731
    eventually(torn_seen, 30, "the torn config logged")
    assert proc.poll() is None and serves(target)

    dataset = fluid["dataset"]
    dataset["mounts"][1]["path"] = "/meta/labels"  # the Dataset's mounts changed
    config.write_text(fluid_config(dataset, str(target), fluid["secrets"], {"preload": "off"}))
    assert proc.wait(timeout=30) == 9
    assert wait_unmounted(str(target), timeout=5)
    log = _log(tmp_path, 0)
    assert log.count("cannot be used, still serving") == 1  # once per broken content
    assert "changed: unmounting to restart with the new mounts" in log
    assert "exiting with 9" in log


@pytest.mark.skipif(os.geteuid() != 0, reason="mount --bind needs root")
def test_warmup_through_a_bind_mount_fills_the_mounts_cache(
    fluid: dict[str, Any], start, tmp_path
) -> None:
    """A DataProcess pod has the Dataset's volume as a bind mount of the FUSE container's
    mount, without its record or cache: `pffs warmup` there reads through the mount."""
    target, cache = fluid["target"], tmp_path / "cache"
    proc = start(fluid)
    volume = tmp_path / "data"  # where the pod sees the Dataset
    volume.mkdir()
    subprocess.run(["mount", "--bind", str(target), str(volume)], check=True)
    try:
        before = run_pffs("cache", "info", "--cache-dir", str(cache))
        assert "0 blocks" in before.stdout, before.stdout
        result = run_pffs("warmup", str(volume / "imagenet"), str(volume / "labels"))
        assert result.returncode == 0, result.stderr
        assert "2 files" in result.stdout and "read through the mount" in result.stdout
        after = run_pffs("cache", "info", "--cache-dir", str(cache))
        assert re.search(r"s3://\S+/imagenet@\S+: 1 blocks", after.stdout), after.stdout
        missing = run_pffs("warmup", str(volume / "nope"))
        assert missing.returncode == 2 and "no such file" in missing.stderr
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=False)
    proc.terminate()
    assert proc.wait(timeout=60) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="mount --bind needs root")
def test_an_app_pods_read_only_volume_takes_an_order_and_the_prestop_ends_pffs(
    fluid: dict[str, Any], start, tmp_path: Path
) -> None:
    """Fluid hands a ReadOnlyMany Dataset to an app pod as a read-only bind of the target path:
    a job there hands its order over through `.pffs/preload.sock`. Its socket bound, pffs is
    still ended by Fluid's default preStop, `umount <targetPath>`, with exit status 0."""
    target = fluid["target"]
    proc = start(fluid)
    volume = tmp_path / "data"
    volume.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(target), str(volume)], check=True)
    try:
        bad = preload_order(str(volume), ["imagenet/train/shard-0.tar", "labels/none.txt"])
        assert bad == ["labels/none.txt: no such file"]
    finally:
        subprocess.run(["umount", str(volume)], check=True)  # the app pod is gone first
    prestop = subprocess.run(["umount", str(target)], capture_output=True, text=True)
    assert prestop.returncode == 0, prestop.stderr
    assert proc.wait(timeout=60) == 0
    assert wait_unmounted(str(target), timeout=5)


# mountPoints a Dataset may not name under the fixture's profile (--allow-local DIR only):
# each refused with one line naming it (issue 48: arrow+file:///etc mounted /etc as root).
NOT_ALLOWED = {
    "arrow+file:///etc": "mounts[1].mountPoint: local directories are not allowed here",
    "arrow+file://localhost/etc/": "mounts[1].mountPoint: local directories are not allowed here",
    "file:///etc": "mounts[1].mountPoint: local directories are not allowed here",
    "gs://bucket/etc": "mounts[1].mountPoint: 'gs://bucket/etc' has gs://; a Dataset may name",
    "hdfs:///etc": "mounts[1].mountPoint: hdfs:// without a namenode reads the container's",
}


@pytest.mark.parametrize("mount_point", NOT_ALLOWED)
def test_a_source_the_profile_does_not_allow_is_one_line(
    fluid: dict[str, Any], mount_point: str
) -> None:
    config, target = fluid["config"], fluid["target"]
    dataset = fluid["dataset"]
    dataset["mounts"][1] = {"mountPoint": mount_point, "name": "etc"}
    config.write_text(fluid_config(dataset, str(target), fluid["secrets"]))
    result = subprocess.run(
        [*PFFS, "fluid", "--config", str(config), *fluid["profile"]],
        capture_output=True,
        text=True,
        timeout=60,
        env=container_env(),
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"pffs: {NOT_ALLOWED[mount_point]}"), result.stderr
    assert result.stderr.count("\n") == 1
    assert not target.exists(), "refused before anything is made"
    assert not _mounts_at(target)


def test_arrow_file_reads_a_directory_the_profile_allows(fluid: dict[str, Any], start) -> None:
    """The local backend through pyarrow is held to --allow-local, and served beneath it."""
    config, target = fluid["config"], fluid["target"]
    dataset = fluid["dataset"]
    local = dataset["mounts"][1]["mountPoint"].removeprefix("local://")
    dataset["mounts"][1]["mountPoint"] = f"arrow+file://{local}"
    config.write_text(fluid_config(dataset, str(target), fluid["secrets"]))
    proc = start(fluid)
    assert (target / "labels" / "classes.txt").read_text() == "cat\ndog\n"
    proc.terminate()
    assert proc.wait(timeout=60) == 0
