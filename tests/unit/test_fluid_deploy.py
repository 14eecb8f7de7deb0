"""deploy/fluid/: the ThinRuntimeProfile, Dataset, ThinRuntime and DataProcess, checked against
Fluid's own CRD schemas and against pffs.

The schemas are Fluid v1.0.8's CRDs, kept in tests/data/fluid-crds (README there): each
object is validated against its kind's openAPIV3Schema with jsonschema, strictly (an unknown
field fails, as `kubectl apply --validate=strict` does; the API server would drop it). The
Secret is checked against the Kubernetes schemas with kubernetes-validate. Then the objects
are checked against the code: the profile's command and probe parse with pffs's own parser
and run the image's entrypoint, the file system type is the one pffs mounts with, the Dataset
and ThinRuntime turn, through a port of Fluid's controller (tests/fluid_controller.py), into a
config that `pffs fluid` accepts with the cache where the tieredstore puts it, and the
DataProcess warms paths the Dataset has.

Not checked here: no Fluid controller or API server runs on this machine.
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pffs.cli import options
from pffs.cli.fluidconfig import read_document, translated
from pffs.mounting.kernel import FSTYPE
from pffs.version import __version__
from tests.fluid_controller import fluid_config, write_secret
from tests.unit.test_image import _dockerfile

ROOT = Path(__file__).resolve().parents[2]
FLUID = ROOT / "deploy" / "fluid"
CRDS = ROOT / "tests" / "data" / "fluid-crds"
KUBE_VERSION = "1.31.0"

Doc = dict[str, Any]


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever Kubernetes would prune them."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def _validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    found = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version["served"]:
                schema = _strict(version["schema"]["openAPIV3Schema"])
                found[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    return found


VALIDATORS = _validators()
DOCS = [
    doc for path in sorted(FLUID.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
]
BY_KIND = {doc["kind"]: doc for doc in DOCS}


def test_the_crds_are_the_four_kinds_used() -> None:
    assert sorted(kind for _, kind in VALIDATORS) == [
        "DataProcess",
        "Dataset",
        "ThinRuntime",
        "ThinRuntimeProfile",
    ]
    assert sorted(BY_KIND) == [
        "DataProcess",
        "Dataset",
        "Secret",
        "ThinRuntime",
        "ThinRuntimeProfile",
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_each_object_passes_its_schema(doc: Doc) -> None:
    key = (doc["apiVersion"], doc["kind"])
    if key in VALIDATORS:
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATORS[key].iter_errors(doc)]
        assert not errors, errors
    else:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_the_strict_schemas_refuse_a_misspelt_field() -> None:
    profile = copy.deepcopy(BY_KIND["ThinRuntimeProfile"])
    profile["spec"]["fuse"]["comand"] = profile["spec"]["fuse"].pop("command")
    assert list(VALIDATORS[("data.fluid.io/v1alpha1", "ThinRuntimeProfile")].iter_errors(profile))
    dataset = copy.deepcopy(BY_KIND["Dataset"])
    del dataset["spec"]["mounts"][0]["mountPoint"]
    assert list(VALIDATORS[("data.fluid.io/v1alpha1", "Dataset")].iter_errors(dataset))


def test_the_profile_runs_pffs_fluid_from_the_image() -> None:
    fuse = BY_KIND["ThinRuntimeProfile"]["spec"]["fuse"]
    # Fluid's CSI plugin greps /proc/self/mountinfo for the target path and this string.
    assert BY_KIND["ThinRuntimeProfile"]["spec"]["fileSystemType"] == FSTYPE
    assert f"{fuse['image']}:{fuse['imageTag']}" == f"ghcr.io/pffs/pffs:{__version__}"
    [entrypoint] = [w for w in _dockerfile() if w[0] == "ENTRYPOINT"]
    command = fuse["command"]
    assert [*json.loads(" ".join(entrypoint[1:])), "fluid"] == command  # tini -- pffs fluid
    probe = options.build_parser().parse_args(fuse["livenessProbe"]["exec"]["command"][1:])
    assert probe.command == "fluid" and probe.check
    # The probe's own timeout is above the check's wait for the mount (pffs.cli.fluid).
    from pffs.cli.fluid import CHECK_TIMEOUT

    assert fuse["livenessProbe"]["timeoutSeconds"] > CHECK_TIMEOUT


def test_dataset_and_runtime_make_a_config_pffs_fluid_mounts(tmp_path: Path) -> None:
    dataset, runtime = BY_KIND["Dataset"], BY_KIND["ThinRuntime"]
    profile, secret = BY_KIND["ThinRuntimeProfile"], BY_KIND["Secret"]
    assert runtime["metadata"]["name"] == dataset["metadata"]["name"]  # Fluid binds them by name
    assert runtime["spec"]["profileName"] == profile["metadata"]["name"]
    secrets = tmp_path / "secrets"
    write_secret(secrets, secret["metadata"]["name"], secret["stringData"])
    fuse_options = runtime["spec"]["fuse"]["options"]
    config = tmp_path / "config.json"
    config.write_text(fluid_config(dataset["spec"], "/runtime-mnt/t", secrets, fuse_options))
    # MOUNT_OPTIONS: the profile's and the runtime's fuse.options, as Fluid joins them.
    joined = {**profile["spec"]["fuse"]["options"], **fuse_options}
    env = {"MOUNT_OPTIONS": ",".join(f"{k}={v}" for k, v in joined.items())}
    with translated(read_document(str(config)), env, str(config)) as mount:
        tree = {entry.path: entry.source.url for entry in mount.table}
        assert tree == {
            "train": "s3://datasets/imagenet/train",
            "labels": "file:///mnt/datasets/imagenet-labels",
        }
        assert mount.fuse.read_only and mount.meta.dir_ttl > 86400
        [level] = runtime["spec"]["tieredstore"]["levels"]
        assert mount.cache.disk_dir == level["path"]  # the hostPath Fluid mounts
        assert level["quota"] == "100Gi" and mount.cache.disk_bytes == 100 << 30  # pffs's G: GiB
        assert mount.cache.memory_bytes == 1 << 30


def test_the_dataprocess_warms_the_datasets_paths() -> None:
    process, dataset = BY_KIND["DataProcess"], BY_KIND["Dataset"]
    target = process["spec"]["dataset"]
    assert target["name"] == dataset["metadata"]["name"]
    script = process["spec"]["processor"]["script"]
    assert f"{script['image']}:{script['imageTag']}" == f"ghcr.io/pffs/pffs:{__version__}"
    commands = [
        shlex.split(line) for line in script["source"].splitlines() if line.startswith("pffs ")
    ]
    assert len(commands) == 1
    args = options.build_parser().parse_args(commands[0][1:])
    assert args.command == "warmup"
    names = {f"{target['mountPath']}/{m['name']}" for m in dataset["spec"]["mounts"]}
    assert set(args.paths) == names
