"""The node agent's processes, wired: ``tidelease agent`` (the DaemonSet: NVML health and
availability, the device plugin, hot restarts through CRI, prewarming and the peer cache) and
``tidelease cache``. :func:`register` adds them to the ``tidelease`` command (common/cli.py finds
it through the ``tidelease.commands`` entry point).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
from pathlib import Path

from common.coercion import as_count, as_float, as_int, as_port, as_positive
from common.errors import InvalidInput


def _xids(text: str, problems: list[str]) -> frozenset[int]:
    xids = [as_int("--ignored-xids", x, []) for x in text.split(",") if x.strip()]
    if any(x is None or x < 0 for x in xids):
        problems.append(f"--ignored-xids: want comma-separated whole numbers, got {text!r}")
        return frozenset()
    return frozenset(x for x in xids if x is not None)


# The UUIDs of the fake backend's GPUs: "<prefix>-<index, 4 digits>-0000-0000-000000000000".
FAKE_UUID_PREFIX = "GPU-fake"


# --fake-topology's default: the fake GPUs report no topology (NOT_SUPPORTED), as they always did.
NO_FAKE_TOPOLOGY = "none"


def fake_uuid(index: int, prefix: str = FAKE_UUID_PREFIX) -> str:
    """The UUID of the fake backend's GPU ``index`` (``--fake-uuid-prefix``): two nodes with
    fake GPUs in one cluster tell their devices apart by giving different prefixes."""
    return f"{prefix}-{index:04d}-0000-0000-000000000000"


def flag_problems(args: argparse.Namespace) -> list[str]:
    """Every problem with the agent's own flags and its cache's (the device plugin's settings
    validate themselves): numbers finite, whole numbers whole, ports in range."""
    problems: list[str] = []
    if not (args.node or os.environ.get("NODE_NAME", "")):
        problems.append("--node (or NODE_NAME) is required")
    _xids(args.ignored_xids, problems)
    gpus = as_count("--fake-gpus", args.fake_gpus, problems)
    topology = getattr(args, "fake_topology", NO_FAKE_TOPOLOGY)
    if topology != NO_FAKE_TOPOLOGY:
        from nodeagent.nvmlfake import LAYOUTS, layout

        if topology not in LAYOUTS:
            problems.append(f"--fake-topology: want none or one of {', '.join(LAYOUTS)}")
        elif gpus is not None and gpus != (laid := len(layout(topology))):
            problems.append(f"--fake-gpus: the layout {topology} has {laid} GPUs, got {gpus}")
    if not args.fake_uuid_prefix or not all(
        c.isascii() and (c.isalnum() or c == "-") for c in args.fake_uuid_prefix
    ):
        problems.append(
            f"--fake-uuid-prefix: want letters, digits and dashes, got {args.fake_uuid_prefix!r}"
        )
    for flag, value in (
        ("--quiet-period", args.quiet_period),
        ("--cycle", args.cycle),
        ("--hot-restart-timeout", args.hot_restart_timeout),
    ):
        as_positive(flag, value, problems)
    if args.cache_dir is not None:
        from nodeagent.pulling.command import serve_settings

        port = as_port("--cache-port", args.cache_port, problems)
        if port is not None:
            problems += serve_settings(args, port).validate()
        ttl = as_float("--cache-partial-ttl", args.cache_partial_ttl, problems)
        if ttl is not None and ttl < 0:
            problems.append(f"--cache-partial-ttl: want a number of seconds >= 0, got {ttl:g}")
        as_count("--cache-max-bytes", args.cache_max_bytes, problems, minimum=1)
    return problems


def _agent(args: argparse.Namespace) -> int:
    from common.kubeclient import KubeClient
    from nodeagent.agent import AgentSettings, run_agent
    from nodeagent.deviceplugin.devices import InMemoryDeviceSource
    from nodeagent.deviceplugin.plugin import run_device_plugin
    from nodeagent.deviceplugin.pods import KubePodLookup
    from nodeagent.deviceplugin.settings import DevicePluginSettings
    from nodeagent.health import HealthSettings
    from nodeagent.nvml import GpuReader, NvmlReader, open_reader
    from nodeagent.publishing import KubePublisher

    # Every flag is read strictly and every problem reported at once (exit 2, a line each).
    problems = flag_problems(args)
    node = args.node or os.environ.get("NODE_NAME", "")
    plugin_settings = DevicePluginSettings(
        node_name=node, plugin_dir=args.device_plugin_dir, host_device_root=args.host_device_root
    )
    if not args.no_device_plugin:
        # A missing node is reported above, as the flag.
        named = dataclasses.replace(plugin_settings, node_name=node or "unset")
        problems += [f"device plugin: {p}" for p in named.validate()]
    from nodeagent.dradriver.settings import DraPluginSettings

    dra_settings = DraPluginSettings(
        node_name=node,
        registry_dir=args.kubelet_registry_dir,
        plugins_dir=args.kubelet_plugins_dir,
        cdi_dir=args.cdi_dir,
        host_device_root=args.host_device_root,
    )
    if args.dra:
        dra_named = dataclasses.replace(dra_settings, node_name=node or "unset")
        problems += [f"DRA plugin: {p}" for p in dra_named.validate()]
    if problems:
        raise InvalidInput(problems)
    settings = AgentSettings(
        node=node,
        health=HealthSettings(
            ignored_xids=_xids(args.ignored_xids, []), quiet_period_s=float(args.quiet_period)
        ),
        cycle_s=float(args.cycle),
    )
    reader: GpuReader
    if args.backend == "fake":
        from nodeagent.nvmlfake import FakeNvml, full_gpu, layout

        if args.fake_topology != NO_FAKE_TOPOLOGY:  # a layout's GPUs (--fake-gpus checked above)
            gpus = layout(args.fake_topology)
        else:
            gpus = [full_gpu(i) for i in range(int(args.fake_gpus))]
        for gpu in gpus:
            gpu.uuid = fake_uuid(gpu.minor, args.fake_uuid_prefix)
        reader = NvmlReader(FakeNvml(gpus))
    else:
        reader = open_reader(args.backend)

    from nodeagent.pulling.command import agent_inventory, open_agent_cache

    cache = open_agent_cache(args)  # the peer cache, when --cache-dir is given

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        kube = await KubeClient.connect(args.kubeconfig)
        publisher = KubePublisher(kube, node=node, namespace=args.namespace)
        source = InMemoryDeviceSource()
        runtime = None
        if args.cri_endpoint:
            from nodeagent.cri.client import GrpcRuntime

            runtime = GrpcRuntime(args.cri_endpoint)
        from nodeagent.prewarm import KubePrewarmNode, open_prewarmer, run_prewarm

        # Prewarming (docs/hot-restart.md): on with a CRI runtime and/or the peer cache.
        prewarmer = open_prewarmer(
            node=node,
            kube=kube,
            runtime=runtime,
            cache=cache,
            token_file=args.cache_token_file if cache is not None else None,
        )
        inventory = agent_inventory(cache)
        tasks = [
            asyncio.create_task(
                run_agent(
                    reader=reader,
                    publisher=publisher,
                    settings=settings,
                    on_change=source.set,
                    on_topology=source.set_topology,
                    cache_inventory=(
                        prewarmer.inventory(inventory) if prewarmer is not None else inventory
                    ),
                    prewarm_status=prewarmer.status if prewarmer is not None else None,
                )
            )
        ]
        if prewarmer is not None:
            tasks.append(
                asyncio.create_task(
                    run_prewarm(node=KubePrewarmNode(kube, node), prewarmer=prewarmer)
                )
            )
        if cache is not None:
            tasks.append(asyncio.create_task(cache.run(kube)))
        if not args.no_device_plugin:
            lookup = KubePodLookup(kube, timeout_s=plugin_settings.api_timeout_s)
            tasks.append(
                asyncio.create_task(
                    run_device_plugin(source=source, lookup=lookup, settings=plugin_settings)
                )
            )
        if args.dra:
            from nodeagent.dradriver.claims import KubeClaimReader
            from nodeagent.dradriver.kubeletplugin import run_kubelet_plugin
            from nodeagent.dradriver.slices import run_slice_mirror

            tasks.append(asyncio.create_task(run_slice_mirror(client=kube, node=node)))
            tasks.append(
                asyncio.create_task(
                    run_kubelet_plugin(
                        source=source,
                        claims=KubeClaimReader(kube, timeout_s=dra_settings.api_timeout_s),
                        settings=dra_settings,
                    )
                )
            )
        if runtime is not None:
            from common.hotrestartpods import KubePods
            from nodeagent.hotrestart.podwatch import (
                PodRestarter,
                PodRestartSettings,
                run_pod_hot_restarts,
            )

            restarter = PodRestarter(
                runtime=runtime,
                pods=KubePods(kube),
                settings=PodRestartSettings(node=node, restart_timeout_s=args.hot_restart_timeout),
            )
            tasks.append(asyncio.create_task(run_pod_hot_restarts(kube=kube, restarter=restarter)))
        try:
            await asyncio.wait(
                [*tasks, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            for task in tasks:
                if task.done():
                    task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if runtime is not None:
                await runtime.close()
            await kube.close()
            reader.close()

    asyncio.run(main())
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the node agent's commands to ``tidelease``."""
    from nodeagent.dradriver import settings as dra_defaults

    agent = sub.add_parser("agent", help="run the node agent (DaemonSet on GPU nodes)")
    agent.add_argument("--node", help="this node's name (default: $NODE_NAME)")
    agent.add_argument(
        "--backend",
        choices=["nvml", "null", "fake"],
        default="nvml",
        help="nvml: the driver (no GPUs if it is missing); null: no GPUs; fake: simulated GPUs",
    )
    # Numbers are read as text and checked together (flag_problems): argparse's own types would
    # stop at the first bad one, and float() takes nan and inf.
    agent.add_argument("--fake-gpus", default=8, help="GPUs of the fake backend")
    agent.add_argument(
        "--fake-uuid-prefix",
        default=FAKE_UUID_PREFIX,
        help="the fake backend's GPU UUIDs are <prefix>-<index>-0000-0000-000000000000"
        " (distinct prefixes for two fake nodes of one cluster)",
    )
    agent.add_argument(
        "--fake-topology",
        default=NO_FAKE_TOPOLOGY,
        help="how the fake backend's GPUs are connected: none (no topology), nvswitch-8,"
        " pcie-2socket-8 or nvlink-pairs-4 (--fake-gpus must match the layout's GPUs)",
    )
    agent.add_argument("--kubeconfig", type=Path, help="kubeconfig (default: in-cluster)")
    agent.add_argument(
        "--namespace", default="tidelease-system", help="namespace of the heartbeat Lease"
    )
    agent.add_argument(
        "--ignored-xids",
        default="13,31,43,45,68,109",
        help="application XIDs that do not mark a device unhealthy (79 always does)",
    )
    agent.add_argument(
        "--quiet-period",
        default=300.0,
        help="seconds without faults before a device is healthy again",
    )
    agent.add_argument("--cycle", default=5.0, help="seconds between readings")
    agent.add_argument(
        "--device-plugin-dir",
        type=Path,
        default=Path("/var/lib/kubelet/device-plugins"),
        help="the kubelet's device-plugin directory",
    )
    agent.add_argument(
        "--host-device-root",
        default="",
        help="directory standing in for the host's / when naming device nodes to the kubelet"
        " (test nodes with fake GPUs; default: the host's own /dev)",
    )
    agent.add_argument(
        "--no-device-plugin",
        action="store_true",
        help="do not serve the kubelet device plugin (nodes without a kubelet, e.g. kwok)",
    )
    agent.add_argument(
        "--dra",
        action="store_true",
        help="DRA mode (docs/dra.md): publish this node's GPUs as a ResourceSlice and serve the "
        "kubelet's DRA plugin (driver gpu.tidelease.io); add --no-device-plugin to serve DRA only",
    )
    agent.add_argument(
        "--kubelet-registry-dir",
        type=Path,
        default=dra_defaults.DEFAULT_REGISTRY_DIR,
        help="the kubelet's plugin registration directory (DRA mode)",
    )
    agent.add_argument(
        "--kubelet-plugins-dir",
        type=Path,
        default=dra_defaults.DEFAULT_PLUGINS_DIR,
        help="the kubelet's plugins directory: the DRA socket and prepared claims (DRA mode)",
    )
    agent.add_argument(
        "--cdi-dir",
        type=Path,
        default=dra_defaults.DEFAULT_CDI_DIR,
        help="where the container runtime reads CDI specs (DRA mode)",
    )
    agent.add_argument(
        "--cri-endpoint",
        help="the node's CRI socket (unix:///run/containerd/containerd.sock): turns on hot "
        "restarts of this node's pods (default: off)",
    )
    agent.add_argument(
        "--hot-restart-timeout",
        default=120.0,
        help="seconds from the image patch to the new container running, else rolled back",
    )
    agent.set_defaults(run=_agent)
    from nodeagent.pulling.command import add_agent_flags, add_cache_command

    add_agent_flags(agent)
    add_cache_command(sub)  # tidelease cache pull|add|ls
