"""The plugin's files on the node: a CDI spec per prepared claim, and the checkpoint of them.

A prepared claim's CDI spec (https://github.com/cncf-tags/container-device-interface, version
0.6.0) is ``<cdi dir>/<vendor>-<class>_<claim uid>.json``: the container runtime reads it when the
kubelet names its devices in a container's CRI config. Its name follows from the claim UID alone,
so an unprepare finds it even when the checkpoint lost the claim.

The checkpoint (``<plugin dir>/checkpoint.json``) keeps, per claim UID, the answer given to the
kubelet and the spec written, so that preparing a claim again answers the same, an unprepare
after a restart removes the spec, and a spec lost meanwhile (``/var/run`` is a tmpfs: a reboot)
is written again. Every file is written whole (a temporary file, then a rename over the old one).
A checkpoint that cannot be read is kept aside as ``checkpoint.json.corrupt`` and the plugin
starts from none. Blocking: the plugin calls these from a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.dradriver.preparing import ClaimRef, DeviceNode, Prepared, PreparedDevice

log = logging.getLogger(__name__)

CDI_VERSION = "0.6.0"
CHECKPOINT_VERSION = 1
SPEC_MODE = 0o644  # the runtime (root) reads it; nothing in it is secret
CHECKPOINT_MODE = 0o600


def _node_document(node: DeviceNode) -> dict[str, str]:
    return {"path": node.path, "hostPath": node.host_path, "permissions": node.permissions}


def spec_document(prepared: Prepared, kind: str) -> dict[str, Any]:
    """The CDI spec of a prepared claim (its ``cdi_devices`` must not be empty)."""
    devices = []
    for device in prepared.cdi_devices:
        edits: dict[str, Any] = {}
        if device.env:
            edits["env"] = list(device.env)
        if device.device_nodes:
            edits["deviceNodes"] = [_node_document(n) for n in device.device_nodes]
        devices.append({"name": device.name, "containerEdits": edits})
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices}
    if prepared.common_nodes:
        spec["containerEdits"] = {"deviceNodes": [_node_document(n) for n in prepared.common_nodes]}
    return spec


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """A prepared claim as the checkpoint keeps it."""

    claim: ClaimRef
    devices: tuple[PreparedDevice, ...]
    cdi_file: str | None  # None: nothing to inject (no device of this node)
    cdi_spec: Mapping[str, Any] | None

    def summary(self) -> str:
        return Prepared(self.claim, self.devices, ()).summary()


def _device_to_json(device: PreparedDevice) -> dict[str, Any]:
    return {
        "requestNames": list(device.request_names),
        "poolName": device.pool_name,
        "deviceName": device.device_name,
        "cdiDeviceIDs": list(device.cdi_device_ids),
        "uuid": device.uuid,
    }


def _entry_to_json(entry: Checkpointed) -> dict[str, Any]:
    return {
        "namespace": entry.claim.namespace,
        "name": entry.claim.name,
        "uid": entry.claim.uid,
        "devices": [_device_to_json(d) for d in entry.devices],
        "cdiFile": entry.cdi_file,
        "cdiSpec": entry.cdi_spec,
    }


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"not a list of strings: {value!r:.80}")
    return tuple(value)


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"not a string: {value!r:.80}")
    return value


def _entry_from_json(obj: Any) -> Checkpointed:
    """Raises ValueError, TypeError, KeyError for an entry that is not one."""
    devices = tuple(
        PreparedDevice(
            request_names=_strings(d["requestNames"]),
            pool_name=_string(d["poolName"]),
            device_name=_string(d["deviceName"]),
            cdi_device_ids=_strings(d["cdiDeviceIDs"]),
            uuid=_string(d["uuid"]),
        )
        for d in obj["devices"]
    )
    cdi_file, cdi_spec = obj["cdiFile"], obj["cdiSpec"]
    if (cdi_file is None) != (cdi_spec is None):
        raise ValueError("cdiFile and cdiSpec go together")
    if cdi_spec is not None and not isinstance(cdi_spec, dict):
        raise ValueError("cdiSpec is not an object")
    claim = ClaimRef(_string(obj["namespace"]), _string(obj["name"]), _string(obj["uid"]))
    return Checkpointed(claim, devices, None if cdi_file is None else _string(cdi_file), cdi_spec)


def _write_whole(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask may have taken bits off
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class ClaimFiles:
    """The CDI specs in ``cdi_dir`` and the checkpoint at ``checkpoint_path``."""

    def __init__(self, *, cdi_dir: Path, checkpoint_path: Path, kind: str) -> None:
        self.cdi_dir = cdi_dir
        self.checkpoint_path = checkpoint_path
        self._prefix = kind.replace("/", "-")

    def spec_path(self, uid: str) -> Path:
        """Where the spec of claim ``uid`` is written (``uid`` passed check_ref)."""
        return self.cdi_dir / f"{self._prefix}_{uid}.json"

    def write_spec(self, uid: str, spec: Mapping[str, Any]) -> Path:
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        path = self.spec_path(uid)
        _write_whole(path, json.dumps(spec, indent=2) + "\n", SPEC_MODE)
        return path

    def remove_spec(self, path: Path) -> bool:
        """Remove a spec file; False when it was not there."""
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def restore(self, entry: Checkpointed) -> bool:
        """Write the entry's spec again when its file is gone; True when it was written."""
        if entry.cdi_file is None or entry.cdi_spec is None or Path(entry.cdi_file).exists():
            return False
        path = Path(entry.cdi_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(path, json.dumps(entry.cdi_spec, indent=2) + "\n", SPEC_MODE)
        return True

    def load(self) -> dict[str, Checkpointed]:
        """The checkpointed claims by UID; none when there is no checkpoint or it is unreadable
        (kept aside then). Raises OSError when the file is there but cannot be read."""
        try:
            text = self.checkpoint_path.read_text()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(text)
            if data.get("version") != CHECKPOINT_VERSION:
                raise ValueError(f"version {data.get('version')!r}, want {CHECKPOINT_VERSION}")
            entries = {uid: _entry_from_json(obj) for uid, obj in data["claims"].items()}
            wrong = [uid for uid, e in entries.items() if e.claim.uid != uid]
            if wrong:
                raise ValueError(f"entries under another UID: {wrong}")
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            aside = self.checkpoint_path.with_name(self.checkpoint_path.name + ".corrupt")
            log.error(
                "checkpoint %s is unreadable (%s): kept as %s, starting without prepared claims",
                self.checkpoint_path,
                e,
                aside,
            )
            os.replace(self.checkpoint_path, aside)
            return {}
        return entries

    def save(self, entries: Mapping[str, Checkpointed]) -> None:
        self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "version": CHECKPOINT_VERSION,
            "claims": {uid: _entry_to_json(e) for uid, e in sorted(entries.items())},
        }
        _write_whole(self.checkpoint_path, json.dumps(data, indent=1) + "\n", CHECKPOINT_MODE)
