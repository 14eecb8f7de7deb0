"""An injected `credential_process` runs nothing, in any form, and no credentials error ends in
a traceback: `pffs fluid`, `pffs mount` and `pffs warmup` run as processes, with a moto server
on 127.0.0.1 where they must get that far.

The command each case injects would create a marker file; after each run the marker is
absent, the process exited non-zero with one line on stderr and no "Traceback". Keys are
values (pffs.credentials): a newline or another control character in one is refused, a
profile of the container's AWS config is named only when the profile allows node
credentials, no option names a config file, and given keys bypass boto3's chain entirely.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pffs.mounting.kernel import FSTYPE, find_mount
from pffs.testing.servers import DUMMY_CREDENTIALS, MotoServer
from tests.conftest import PFFS, run_pffs, unmount_quietly
from tests.fluid_controller import fluid_config, write_secret
from tests.waiting import eventually

KEY, SECRET = DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"], DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "ran"


@pytest.fixture
def evil_config(tmp_path: Path, marker: Path) -> Path:
    """An AWS config whose default profile and profile `evil` run the marker's command."""
    config = tmp_path / "aws-config"
    config.write_text(
        f"[default]\ncredential_process = touch {marker}\n"
        f"[profile evil]\ncredential_process = touch {marker}\n"
    )
    return config


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any AWS variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return env | extra


def refused(result: subprocess.CompletedProcess[str], marker: Path, line: str) -> None:
    """The run ran nothing and ended with the one line `line` (a prefix) and a non-zero exit."""
    assert not marker.exists(), "the injected command ran"
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"pffs: {line}"), result.stderr


def run_fluid(
    tmp_path: Path,
    dataset: dict[str, Any],
    *flags: str,
    runtime: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.json"
    path.write_text(fluid_config(dataset, str(tmp_path / "target"), tmp_path / "secrets", runtime))
    argv = ["fluid", "--config", str(path), "--secrets-dir", str(tmp_path / "secrets"), *flags]
    return run_pffs(*argv, env=env or clean_env())


def inline_keys(access_key_id: str, **options: str) -> dict[str, Any]:
    """A mount with its keys as values in its options (Fluid's config storage Secret)."""
    keys = {"access-key-id": access_key_id, "secret-access-key": SECRET}
    return {"mountPoint": "s3://bucket-a", "name": "a", "options": keys | options}


def test_a_newline_in_an_inline_key_adds_no_profile(tmp_path: Path, marker: Path) -> None:
    """The attack of issue 34: a key that once ended a credentials INI's line and started a
    profile `evil` with a credential_process, which a second mount then named."""
    injected = f"k\n[evil]\ncredential_process = touch {marker}"
    dataset = {
        "mounts": [
            inline_keys(injected),
            {"mountPoint": "s3://bucket-b", "name": "b", "options": {"profile": "evil"}},
        ]
    }
    result = run_fluid(tmp_path, dataset, "--allow-node-credentials")
    refused(result, marker, "mounts[0].options.access-key-id holds a control character ('\\n')")


@pytest.mark.parametrize("char", ["\r", "\x1b", "\x00", "\x85", "\t"])
def test_a_control_character_in_a_key_is_refused(tmp_path: Path, marker: Path, char: str) -> None:
    result = run_fluid(tmp_path, {"mounts": [inline_keys(f"AKIA{char}x")]})
    refused(result, marker, "mounts[0].options.access-key-id holds a control character")


def test_a_newline_in_a_secret_file_is_refused(tmp_path: Path, marker: Path) -> None:
    keys = {"id": f"AKIA\n[evil]\ncredential_process = touch {marker}\n", "key": SECRET}
    write_secret(tmp_path / "secrets", "s3-keys", keys)
    options = {
        "access-key-id": str(tmp_path / "secrets" / "s3-keys" / "id"),
        "secret-access-key": str(tmp_path / "secrets" / "s3-keys" / "key"),
    }
    dataset = {"mounts": [{"mountPoint": "s3://bucket-a", "name": "a", "options": options}]}
    result = run_fluid(tmp_path, dataset)
    refused(result, marker, "mounts[0].options.access-key-id: the secret file")


PROFILE_NAMED = {
    "a Dataset's option": ({"profile": "evil"}, None, {}, "mounts[0].options.profile"),
    "a ThinRuntime's option": ({}, {"profile": "evil"}, {}, "runtimeOptions.profile"),
    "MOUNT_OPTIONS": ({}, None, {"MOUNT_OPTIONS": "profile=evil"}, "MOUNT_OPTIONS.profile"),
}


@pytest.mark.parametrize(
    "options,runtime,variables,field", PROFILE_NAMED.values(), ids=PROFILE_NAMED
)
def test_a_profile_with_a_credential_process_is_never_named(
    tmp_path: Path,
    marker: Path,
    evil_config: Path,
    options: dict[str, str],
    runtime: dict[str, str] | None,
    variables: dict[str, str],
    field: str,
) -> None:
    dataset = {"mounts": [{"mountPoint": "s3://bucket-a", "name": "a", "options": options}]}
    env = clean_env(AWS_CONFIG_FILE=str(evil_config), **variables)
    result = run_fluid(tmp_path, dataset, runtime=runtime, env=env)
    refused(result, marker, f"{field}: a named profile would use the node's own credentials")


def test_the_containers_default_chain_is_never_run(
    tmp_path: Path, marker: Path, evil_config: Path
) -> None:
    """A mount without keys would run the default profile's process: refused first."""
    dataset = {"mounts": [{"mountPoint": "s3://bucket-a", "name": "a"}]}
    result = run_fluid(tmp_path, dataset, env=clean_env(AWS_CONFIG_FILE=str(evil_config)))
    refused(result, marker, "mounts[0]: an S3 mount without keys would use the node's own")


CONFIG_FILE_OPTIONS = {
    "credentials-file in a Dataset": ({"credentials-file": "E"}, None, {}, "mounts[0].options"),
    "config in a Dataset": ({"config": "E"}, None, {}, "mounts[0].options.config"),
    "aws-config-file in a Dataset": ({"aws-config-file": "E"}, None, {}, "mounts[0].options"),
    "credentials-file in a ThinRuntime": ({}, {"credentials-file": "E"}, {}, "runtimeOptions"),
    "credentials-file in MOUNT_OPTIONS": (
        {},
        None,
        {"MOUNT_OPTIONS": "credentials-file=E"},
        "MOUNT_OPTIONS",
    ),
}


@pytest.mark.parametrize(
    "options,runtime,variables,field", CONFIG_FILE_OPTIONS.values(), ids=CONFIG_FILE_OPTIONS
)
def test_no_option_names_a_config_file(
    tmp_path: Path,
    marker: Path,
    evil_config: Path,
    options: dict[str, str],
    runtime: dict[str, str] | None,
    variables: dict[str, str],
    field: str,
) -> None:
    mount = inline_keys(KEY, **{k: str(evil_config) for k in options})
    runtime = {k: str(evil_config) for k in runtime} if runtime else None
    variables = {k: v.replace("E", str(evil_config)) for k, v in variables.items()}
    result = run_fluid(tmp_path, {"mounts": [mount]}, runtime=runtime, env=clean_env(**variables))
    refused(result, marker, field)
    assert "unknown option" in result.stderr


def test_a_credentials_file_is_read_as_values(
    tmp_path: Path, marker: Path, moto: MotoServer, s3, bucket: str
) -> None:
    """`--credentials-file` (mount(8)'s credentials_file=): its keys are used, its
    credential_process never read; a file of only a process, or a continued line, is refused."""
    s3.put_object(Bucket=bucket, Key="data/a.bin", Body=b"x" * 1000)
    both = tmp_path / "both"
    both.write_text(
        f"[default]\ncredential_process = touch {marker}\n"
        f"aws_access_key_id = {KEY}\naws_secret_access_key = {SECRET}\n"
    )
    argv = ["warmup", f"s3://{bucket}/data", "--endpoint-url", moto.endpoint_url, "--quiet"]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    result = run_pffs(*argv, "--credentials-file", str(both), env=clean_env())
    assert result.returncode == 0, result.stderr
    assert "1 files" in result.stdout and not marker.exists()

    only_process = tmp_path / "only-process"
    only_process.write_text(f"[default]\ncredential_process = touch {marker}\n")
    result = run_pffs(*argv, "--credentials-file", str(only_process), env=clean_env())
    refused(result, marker, f"{only_process} [default]: aws_access_key_id and")
    assert result.returncode == 2

    continued = tmp_path / "continued"
    continued.write_text(
        f"[default]\naws_access_key_id = {KEY}\n  credential_process = touch {marker}\n"
        f"aws_secret_access_key = {SECRET}\n"
    )
    result = run_pffs(*argv, "--credentials-file", str(continued), env=clean_env())
    refused(result, marker, f"{continued} [default] aws_access_key_id holds a control character")


def test_credentials_errors_of_botocore_are_one_line(
    tmp_path: Path, moto: MotoServer, bucket: str
) -> None:
    """The user's own chain (`pffs warmup`, `pffs fluid --allow-node-credentials`): a profile
    whose process fails, a partial profile, a missing one: one line each, never a traceback."""
    config = tmp_path / "aws-config"
    config.write_text(
        "[profile failing]\ncredential_process = false\n"
        "[profile partial]\naws_access_key_id = AKIAONLY\n"
    )
    env = clean_env(AWS_CONFIG_FILE=str(config))
    argv = ["warmup", f"s3://{bucket}", "--endpoint-url", moto.endpoint_url, "--quiet"]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    nothing = tmp_path / "never"
    cases = {
        "failing": (4, "cannot get AWS credentials"),
        "partial": (2, "AWS credentials or config: Partial credentials found"),
        "missing": (2, "AWS credentials or config: The config profile (missing) could not be"),
    }
    for profile, (code, message) in cases.items():
        result = run_pffs(*argv, "--profile", profile, env=env)
        refused(result, nothing, f"s3://{bucket}: {message}")
        assert result.returncode == code, result.stderr
        dataset = {"mounts": [{"mountPoint": f"s3://{bucket}", "options": {"profile": profile}}]}
        result = run_fluid(tmp_path, dataset, "--allow-node-credentials", env=env)
        refused(result, nothing, f"mounts[0] (/): s3://{bucket}: {message}")


def test_a_failed_refresh_of_credentials_is_one_line(
    tmp_path: Path, moto: MotoServer, bucket: str
) -> None:
    """Credentials that expire soon are refreshed when first used (the source's principal is
    read at setup, or a request is signed); the refresh fails (with two lines on stderr): the
    failure is one line, exit 4."""
    runs = tmp_path / "runs"
    soon = (datetime.now(UTC) + timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    answer = json.dumps(
        {"Version": 1, "AccessKeyId": KEY, "SecretAccessKey": SECRET, "Expiration": soon}
    )
    process = tmp_path / "process.sh"
    process.write_text(
        f"#!/bin/sh\nif [ -e {runs} ]; then printf 'first\\nsecond\\n' >&2; exit 1; fi\n"
        f"touch {runs}\necho '{answer}'\n"
    )
    process.chmod(0o755)
    config = tmp_path / "aws-config"
    config.write_text(f"[profile refreshing]\ncredential_process = {process}\n")
    argv = ["warmup", f"s3://{bucket}", "--endpoint-url", moto.endpoint_url, "--quiet"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--profile", "refreshing"]
    result = run_pffs(*argv, env=clean_env(AWS_CONFIG_FILE=str(config)))
    assert runs.exists(), "the user's own process ran once"
    refused(result, tmp_path / "never", f"s3://{bucket}: cannot get AWS credentials: Error when")
    assert result.returncode == 4


@pytest.mark.mount
def test_given_keys_bypass_the_chain_while_mounted(
    tmp_path: Path, marker: Path, evil_config: Path, moto: MotoServer, s3, bucket: str
) -> None:
    """The container's default profile runs a process; a mount with keys of its own is
    served from moto without ever running it."""
    s3.put_object(Bucket=bucket, Key="train/a.txt", Body=b"hello")
    write_secret(tmp_path / "secrets", "s3-keys", {"id": KEY, "key": SECRET})
    folder = tmp_path / "secrets" / "s3-keys"
    options = {
        "endpoint-url": moto.endpoint_url,
        "access-key-id": str(folder / "id"),
        "secret-access-key": str(folder / "key"),
    }
    dataset = {"mounts": [{"mountPoint": f"s3://{bucket}/train", "name": "t", "options": options}]}
    target = tmp_path / "target"
    config = tmp_path / "config.json"
    config.write_text(fluid_config(dataset, str(target), tmp_path / "secrets"))
    argv = ["fluid", "--config", str(config), "--secrets-dir", str(tmp_path / "secrets")]
    argv += ["--options", f"cache-dir={tmp_path / 'cache'}"]
    if os.geteuid() != 0:
        argv += ["--options", "allow-other=false"]
    log = tmp_path / "fluid.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*PFFS, *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env(AWS_CONFIG_FILE=str(evil_config)),
        )
    try:

        def mounted() -> bool:
            assert proc.poll() is None, log.read_text()
            entry = find_mount(str(target))
            return entry is not None and entry.fstype == FSTYPE

        eventually(mounted, 60, "the mount")
        assert (target / "t" / "a.txt").read_bytes() == b"hello"
        assert not marker.exists(), "the default profile's process ran"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        unmount_quietly(target)


@pytest.mark.mount
def test_a_credentials_file_reaches_the_daemon_as_values_only(
    tmp_path: Path, marker: Path, evil_config: Path, moto: MotoServer, s3, bucket: str
) -> None:
    """`pffs mount --credentials-file` (the CSI driver's way too): the keys reach the daemon
    through its stdin pipe, and are in neither its command line nor its environment; the
    mount keeps no record on disk, so `pffs warmup` reads through it, with its keys; the
    default profile's process never runs."""
    s3.put_object(Bucket=bucket, Key="a.txt", Body=b"through the daemon")
    secret = f"{SECRET}-{os.getpid()}"  # moto checks no signature: a value found nowhere else
    keys = tmp_path / "credentials"
    keys.write_text(f"[default]\naws_access_key_id = {KEY}\naws_secret_access_key = {secret}\n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    state = tmp_path / "state"
    env = clean_env(AWS_CONFIG_FILE=str(evil_config), XDG_STATE_HOME=str(state))
    argv = ["mount", f"s3://{bucket}", str(mnt), "--endpoint-url", moto.endpoint_url]
    argv += ["--credentials-file", str(keys), "--cache-dir", str(tmp_path / "cache")]
    result = run_pffs(*argv, env=env)
    assert result.returncode == 0, result.stderr
    try:
        assert (mnt / "a.txt").read_bytes() == b"through the daemon"
        pid = int(result.stdout.split("(pid ")[1].split(",")[0])
        for part in ("cmdline", "environ"):
            assert secret.encode() not in Path(f"/proc/{pid}/{part}").read_bytes(), part
        records = state / "pffs" / "mounts"
        assert not records.exists() or not list(records.iterdir())
        warmed = run_pffs("warmup", "--quiet", str(mnt / "a.txt"), env=env)
        assert warmed.returncode == 0 and "read through the mount" in warmed.stdout, warmed
        assert not marker.exists(), "the default profile's process ran"
    finally:
        assert run_pffs("umount", str(mnt)).returncode == 0
