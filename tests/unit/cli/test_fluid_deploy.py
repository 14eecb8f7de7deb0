"""deploy/fluid/: the ThinRuntimeProfile, Dataset, ThinRuntime and DataProcess, checked against
Fluid's own CRD schemas and against pffs.

The schemas are Fluid v1.0.8's CRDs, kept in tests/data/fluid-crds (README there): each
object is validated against its kind's openAPIV3Schema with jsonschema, strictly (an unknown
field fails, as `kubectl apply --validate=strict` does; the API server would drop it). The
Secret is checked against the Kubernetes schemas with kubernetes-validate. Then the objects
are checked against the code: the profile's command, args and probe parse with pffs's own
parser and run the image's entrypoint, the file system type is the one pffs mounts with, the
Dataset and ThinRuntime turn, through a port of Fluid's controller (tests/fluid_controller.py),
into a config that `pffs fluid` accepts under the profile's policy with the cache in the
profile's hostPath, and the DataProcess warms paths the Dataset has. The admission policy's
CEL expressions are evaluated (cel-python) on the ThinRuntime here and on ones that set each
field the profile keeps.

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
from pffs.cli.fluid import policy_of
from pffs.cli.fluidconfig import read_document, translated
from pffs.cli.fluidpolicy import Policy
from pffs.mounting.kernel import FSTYPE
from pffs.version import __version__
from tests.deploy.test_image import _dockerfile
from tests.fluid_controller import fluid_config, write_secret

ROOT = Path(__file__).resolve().parents[3]
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
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
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
    # The cache directory the profile's options name is its hostPath volume, in the container.
    policy = profile_policy(None)
    [cache_dir] = [o.split("=", 1)[1] for o in policy.options[0].split(",") if "cache-dir" in o]
    [mount] = fuse["volumeMounts"]
    [volume] = BY_KIND["ThinRuntimeProfile"]["spec"]["volumes"]
    assert mount["mountPath"] == cache_dir == volume["hostPath"]["path"]
    assert mount["name"] == volume["name"] and policy.secrets_dir == "/etc/fluid/secrets"
    assert not policy.node_credentials and policy.local_roots == ("/mnt/datasets",)
    # The probe's own timeout is above the check's wait for the mount (pffs.cli.fluid).
    from pffs.cli.fluid import CHECK_TIMEOUT

    assert fuse["livenessProbe"]["timeoutSeconds"] > CHECK_TIMEOUT


def profile_policy(secrets: Path | None) -> Policy:
    """The policy of the profile's command line (secrets read from `secrets`, if given)."""
    fuse = BY_KIND["ThinRuntimeProfile"]["spec"]["fuse"]
    args = options.build_parser().parse_args([*fuse["command"][3:], *fuse["args"]])
    if secrets is not None:
        args.secrets_dir = str(secrets)
    return policy_of(args)


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
    joined = {**profile["spec"]["fuse"].get("options", {}), **fuse_options}
    env = {"MOUNT_OPTIONS": ",".join(f"{k}={v}" for k, v in joined.items())}
    policy = profile_policy(secrets)
    mount = translated(read_document(str(config)), env, str(config), policy)
    tree = {entry.path: entry.source.url for entry in mount.table}
    assert tree == {
        "train": "s3://datasets/imagenet/train",
        "labels": "file:///mnt/datasets/imagenet-labels",
    }
    assert mount.fuse.read_only and mount.meta.dir_ttl > 86400  # the Dataset's indefinite
    assert mount.meta.negative_ttl == 1.0
    assert mount.cache.disk_dir == "/var/cache/pffs-fluid"  # the profile's hostPath
    assert mount.cache.disk_bytes == 100 << 30 and mount.cache.memory_bytes == 1 << 30
    [train] = [entry for entry in mount.table if entry.path == "train"]
    assert train.source.credentials is not None


def admission_allows(runtime: Doc) -> bool:
    """Whether admission.yaml's policy lets `runtime` be created (its CEL, by cel-python)."""
    import celpy
    from celpy.adapter import json_to_cel

    policy = BY_KIND["ValidatingAdmissionPolicy"]["spec"]
    env = celpy.Environment()
    activation = {"object": json_to_cel(runtime)}

    def holds(expression: str) -> bool:
        return bool(env.program(env.compile(expression)).evaluate(activation))

    if not all(holds(c["expression"]) for c in policy["matchConditions"]):
        return True  # not a ThinRuntime of the pffs profile
    return all(holds(v["expression"]) for v in policy["validations"])


KEPT_BY_THE_PROFILE = {
    "fuse.image": ("fuse", "image", "evil/root-shell"),
    "fuse.command": ("fuse", "command", ["sh", "-c", "id"]),
    "fuse.args": ("fuse", "args", ["--allow-node-credentials"]),
    "fuse.env": ("fuse", "env", [{"name": "AWS_CONFIG_FILE", "value": "/tmp/x"}]),
    "fuse.volumeMounts": ("fuse", "volumeMounts", [{"name": "h", "mountPath": "/h"}]),
    "fuse.lifecycle": ("fuse", "lifecycle", {"preStop": {"exec": {"command": ["id"]}}}),
    "volumes": ("spec", "volumes", [{"name": "h", "hostPath": {"path": "/"}}]),
    "tieredstore": ("spec", "tieredstore", {"levels": [{"path": "/etc", "quota": "1Gi"}]}),
}


@pytest.mark.parametrize("where,field,value", KEPT_BY_THE_PROFILE.values(), ids=KEPT_BY_THE_PROFILE)
def test_admission_keeps_the_profiles_fields(where: str, field: str, value: Any) -> None:
    runtime = copy.deepcopy(BY_KIND["ThinRuntime"])
    assert admission_allows(runtime)
    spec = runtime["spec"]
    (spec.setdefault("fuse", {}) if where == "fuse" else spec)[field] = value
    assert not admission_allows(runtime)
    spec["profileName"] = "another"  # another profile's runtimes are its own business
    assert admission_allows(runtime)


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
