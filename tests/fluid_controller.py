"""Config files as Fluid's controller writes them for a ThinRuntime's FUSE container.

A port of what Fluid v1.0.8 does (pkg/ddc/thin/transform_config.go, ufs_internal.go and
charts/thin/templates/fuseconfig/fuseconfig.yaml), so the tests feed pffs the very bytes a
cluster would: each mount's options are the Dataset's sharedOptions overridden by its own,
each encryptOption (shared ones first) becomes the path of the secret's key file under the
secrets directory, encryptOptions are dropped, accessModes default to ReadOnlyMany, and the
JSON is Go's encoding/json: one line, struct fields in declaration order, map keys sorted,
empty fields left out, then the newline of the ConfigMap's block scalar.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Mount's JSON fields in the Go struct's order (api/v1alpha1/dataset_types.go).
MOUNT_FIELDS = ("mountPoint", "options", "name", "path", "readOnly", "shared")


def write_secret(secrets_dir: Path, name: str, data: dict[str, str]) -> None:
    """A Kubernetes Secret as a volume: one file per key, as the kubelet writes them."""
    folder = secrets_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        (folder / key).write_text(value)


def fluid_config(
    dataset: dict[str, Any],
    target_path: str,
    secrets_dir: Path,
    runtime_options: dict[str, str] | None = None,
) -> str:
    """The text of config.json for a Dataset `spec` (mounts, sharedOptions,
    sharedEncryptOptions, accessModes) and a ThinRuntime's fuse.options."""
    shared_encrypt = dataset.get("sharedEncryptOptions", [])
    mounts = []
    for mount in dataset["mounts"]:
        options = {**dataset.get("sharedOptions", {}), **mount.get("options", {})}
        for option in [*shared_encrypt, *mount.get("encryptOptions", [])]:
            ref = option["valueFrom"]["secretKeyRef"]
            options[option["name"]] = os.path.join(secrets_dir, ref["name"], ref["key"])
        fields = {**mount, "options": options}
        mounts.append({k: fields[k] for k in MOUNT_FIELDS if fields.get(k)})
    config: dict[str, Any] = {"mounts": mounts, "targetPath": target_path}
    if runtime_options:
        config["runtimeOptions"] = runtime_options
    config["accessModes"] = dataset.get("accessModes") or ["ReadOnlyMany"]
    return _go_json(config) + "\n"


def _go_json(value: Any) -> str:
    # Go sorts map keys; struct fields keep their order (the dicts above are built in it), so
    # only maps of options are sorted here.
    def sort_maps(item: Any, key: str = "") -> Any:
        if isinstance(item, dict):
            pairs = sorted(item.items()) if key in ("options", "runtimeOptions") else item.items()
            return {k: sort_maps(v, k) for k, v in pairs}
        if isinstance(item, list):
            return [sort_maps(v) for v in item]
        return item

    return json.dumps(sort_maps(value), separators=(",", ":"))
