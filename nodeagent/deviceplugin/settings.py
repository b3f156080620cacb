"""Device plugin settings: a frozen tree with named defaults and a pure ``validate()``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common import contract
from common.coercion import finite

API_VERSION = "v1beta1"  # deviceplugin API version sent in RegisterRequest
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_SOCKET_NAME = "tidelease-gpu.sock"
KUBELET_SOCKET_NAME = "kubelet.sock"
_UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL


@dataclass(frozen=True, slots=True)
class DevicePluginSettings:
    node_name: str = ""  # the node this agent runs on (spec.nodeName of its pods); required
    plugin_dir: Path = DEFAULT_PLUGIN_DIR  # the kubelet's device-plugin dir
    socket_name: str = DEFAULT_SOCKET_NAME  # the plugin's socket, in plugin_dir
    kubelet_socket_name: str = KUBELET_SOCKET_NAME
    resource_name: str = contract.DEFAULT_GPU_RESOURCE
    # Device nodes every GPU container gets besides its GPUs' own, e.g. ("/dev/nvidiactl",
    # "/dev/nvidia-uvm"); empty leaves them to the NVIDIA container runtime.
    control_devices: tuple[str, ...] = ()
    device_permissions: str = "rw"
    # Where the host's "/" is for device nodes: "" on a real node. A test node with fake GPUs sets
    # a directory holding dev/nvidiaN stand-ins (hack/realnode.sh makes them), so containers get
    # /dev/nvidiaN backed by those files.
    host_device_root: str = ""
    # Bound on each API-server call made while the kubelet waits (list pods, mark assigned).
    api_timeout_s: float = 3.0
    # While the node's allocation ledger shows no entry for the pod being allocated (or cannot be
    # read), it is read again this often, for up to api_timeout_s; then the container is refused.
    ledger_poll_s: float = 0.25
    register_timeout_s: float = 5.0
    register_backoff_s: float = 0.5  # first retry delay; doubles up to register_backoff_max_s
    register_backoff_max_s: float = 10.0
    socket_poll_s: float = 1.0  # how often to check that the kubelet has not removed our socket
    stop_grace_s: float = 2.0  # in-flight calls get this long when the server stops

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.socket_name

    @property
    def kubelet_socket_path(self) -> Path:
        return self.plugin_dir / self.kubelet_socket_name

    def validate(self) -> list[str]:
        """Every problem at once; empty when the settings are usable."""
        problems = []
        if not self.node_name:
            problems.append("node_name is required (the node this agent runs on)")
        if not self.plugin_dir.is_absolute():
            problems.append(f"plugin_dir {self.plugin_dir} is not an absolute path")
        for name in ("socket_name", "kubelet_socket_name"):
            value = getattr(self, name)
            if not value or "/" in value:
                problems.append(f"{name} {value!r} must be a file name in plugin_dir")
        if self.socket_name == self.kubelet_socket_name:
            problems.append("socket_name must differ from kubelet_socket_name")
        if len(str(self.socket_path).encode()) > _UNIX_PATH_MAX:
            problems.append(f"socket path {self.socket_path} is longer than a unix socket allows")
        if "/" not in self.resource_name:
            problems.append(f"resource_name {self.resource_name!r} is not an extended resource")
        if not self.device_permissions or set(self.device_permissions) - set("rwm"):
            problems.append(f"device_permissions {self.device_permissions!r}: want some of r, w, m")
        if self.host_device_root and not self.host_device_root.startswith("/"):
            problems.append(f"host_device_root {self.host_device_root!r} is not an absolute path")
        for path in self.control_devices:
            if not path.startswith("/dev/"):
                problems.append(f"control device {path!r} is not under /dev/")
        for name in (
            "api_timeout_s",
            "ledger_poll_s",
            "register_timeout_s",
            "register_backoff_s",
            "register_backoff_max_s",
            "socket_poll_s",
        ):
            if not finite(getattr(self, name)) or getattr(self, name) <= 0:
                problems.append(f"{name} must be a positive finite number")
        if not finite(self.stop_grace_s) or self.stop_grace_s < 0:
            problems.append("stop_grace_s must be a finite number, not negative")
        return problems
