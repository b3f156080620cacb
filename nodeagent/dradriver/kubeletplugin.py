"""The DRA kubelet plugin: prepares the node's GPUs for the pods whose ResourceClaims got them.

Two gRPC servers on unix sockets, as the kubelet expects of a DRA driver:

* the DRA service (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``) on
  ``<plugins dir>/<driver>/dra.sock``: NodePrepareResources, NodeUnprepareResources;
* plugin registration (``pluginregistration.Registration``) on
  ``<plugins_registry>/<driver>-reg.sock``: the kubelet's plugin watcher sees the socket, asks
  GetInfo (type DRAPlugin, the driver, the DRA socket, the service "v1.DRAPlugin") and reports
  the outcome with NotifyRegistrationStatus. Removing the socket deregisters the plugin.

The DRA server starts first, so it answers by the time the kubelet dials it. Each claim of a call
gets its own answer: an error string for one claim (not found, replaced, not allocated, a device
unknown or unhealthy, the API server down) never fails the others or the call; the kubelet fails
the pod's start for it and retries. Claims are read from the API server concurrently, each read
bounded by ``api_timeout_s``; decisions and file writes run one call at a time, so the checkpoint
is always one consistent state. The sockets are the kubelet's only (mode 0600: it runs as root).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from common.errors import InvalidInput, NotFound, TideleaseError
from nodeagent.deviceplugin import sockets
from nodeagent.deviceplugin.devices import DeviceSource
from nodeagent.deviceplugin.sockets import FileId
from nodeagent.dradriver import api_pb2 as pb
from nodeagent.dradriver import api_pb2_grpc, registration_pb2, registration_pb2_grpc
from nodeagent.dradriver.cdi import Checkpointed, ClaimFiles, spec_document
from nodeagent.dradriver.claims import ClaimReader
from nodeagent.dradriver.preparing import (
    ClaimObject,
    ClaimRef,
    Prepared,
    Refused,
    Target,
    check_ref,
    decide,
    parse_claim,
)
from nodeagent.dradriver.settings import DRA_SERVICE, PLUGIN_TYPE, DraPluginSettings

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
PLUGIN_DIR_MODE = 0o750


class ClaimPreparer:
    """Prepares and unprepares claims: reads them, decides, writes specs and the checkpoint.

    Build it with :meth:`open`, which loads the checkpoint and writes back lost specs.
    """

    def __init__(
        self,
        *,
        source: DeviceSource,
        claims: ClaimReader,
        settings: DraPluginSettings,
        files: ClaimFiles,
        prepared: dict[str, Checkpointed],
    ) -> None:
        self._source = source
        self._claims = claims
        self._settings = settings
        self._files = files
        self._prepared = prepared
        self._lock = asyncio.Lock()
        self._target = Target(
            driver=settings.driver,
            pool=settings.node_name,
            cdi_kind=settings.cdi_kind,
            host_root=settings.host_device_root,
            permissions=settings.device_permissions,
            control_devices=settings.control_devices,
        )

    @classmethod
    async def open(
        cls, *, source: DeviceSource, claims: ClaimReader, settings: DraPluginSettings
    ) -> ClaimPreparer:
        """Raises OSError when the checkpoint is there but cannot be read."""
        files = ClaimFiles(
            cdi_dir=settings.cdi_dir,
            checkpoint_path=settings.checkpoint_path,
            kind=settings.cdi_kind,
        )
        prepared = await asyncio.to_thread(files.load)
        for entry in prepared.values():
            await _restore(files, entry)
        if prepared:
            names = ", ".join(str(e.claim) for e in prepared.values())
            log.info("checkpoint: %d prepared claim(s): %s", len(prepared), names)
        return cls(source=source, claims=claims, settings=settings, files=files, prepared=prepared)

    async def _read(self, ref: ClaimRef) -> ClaimObject | str:
        """The claim, or why it could not be read."""
        timeout_s = self._settings.api_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                obj = await self._claims.get(ref.namespace, ref.name)
            return parse_claim(obj)
        except NotFound:
            return f"ResourceClaim {ref.namespace}/{ref.name} not found"
        except InvalidInput as e:
            return f"ResourceClaim {ref.namespace}/{ref.name} is unreadable: {e}"
        except TideleaseError as e:
            return f"reading ResourceClaim {ref.namespace}/{ref.name}: {e}"
        except TimeoutError:
            return f"reading ResourceClaim {ref.namespace}/{ref.name} took over {timeout_s:g} s"
        except Exception as e:
            log.exception("claim %s: reading it failed", ref)
            return f"reading ResourceClaim {ref.namespace}/{ref.name}: {type(e).__name__}: {e}"

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, Checkpointed | str]:
        """Per claim UID: the prepared claim, or why it is not."""
        answers: dict[str, Checkpointed | str] = {}
        fresh: list[ClaimRef] = []
        for ref in {r.uid: r for r in refs}.values():
            problem = check_ref(ref)
            if problem is not None:
                log.warning("claim %s refused: %s", ref, problem)
                answers[ref.uid] = problem
            elif ref.uid not in self._prepared:
                fresh.append(ref)
        # Slow API reads before taking the lock, so one slow claim does not hold up other calls.
        read = await asyncio.gather(*(self._read(ref) for ref in fresh))
        async with self._lock:
            for ref in {r.uid: r for r in refs}.values():
                entry = self._prepared.get(ref.uid)
                if entry is not None and ref.uid not in answers:
                    answers[ref.uid] = entry
                    await _restore(self._files, entry)
                    log.info("claim %s already prepared: %s", ref, entry.summary())
            new: dict[str, Checkpointed] = {}
            for ref, got in zip(fresh, read, strict=True):
                if ref.uid in self._prepared:  # a concurrent call prepared it meanwhile
                    continue
                answer = await self._prepare_one(ref, got)
                answers[ref.uid] = answer
                if isinstance(answer, Checkpointed):
                    new[ref.uid] = answer
            if new:
                try:
                    await asyncio.to_thread(self._files.save, {**self._prepared, **new})
                except OSError as e:
                    log.error("cannot write checkpoint %s: %s", self._files.checkpoint_path, e)
                    for uid in new:
                        answers[uid] = f"cannot write checkpoint: {e}"
                    new = {}
                self._prepared.update(new)
                for entry in new.values():
                    log.info("claim %s prepared: %s", entry.claim, entry.summary())
        return answers

    async def _prepare_one(self, ref: ClaimRef, got: ClaimObject | str) -> Checkpointed | str:
        if isinstance(got, str):
            log.warning("claim %s not prepared: %s", ref, got)
            return got
        decision = decide(ref, got, self._source.current(), self._target)
        if isinstance(decision, Refused):
            log.warning("claim %s refused: %s", ref, decision.reason)
            return decision.reason
        return await self._write(decision)

    async def _write(self, prepared: Prepared) -> Checkpointed | str:
        if not prepared.cdi_devices:
            return Checkpointed(prepared.claim, prepared.devices, None, None)
        spec = spec_document(prepared, self._settings.cdi_kind)
        try:
            path = await asyncio.to_thread(self._files.write_spec, prepared.claim.uid, spec)
        except OSError as e:
            log.error("claim %s: cannot write its CDI spec: %s", prepared.claim, e)
            return f"cannot write CDI spec: {e}"
        return Checkpointed(prepared.claim, prepared.devices, str(path), spec)

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Per claim UID: "" once the claim's spec is gone, else why not. Claims never prepared
        (or already unprepared) succeed."""
        answers: dict[str, str] = {}
        async with self._lock:
            kept = dict(self._prepared)
            removed: list[str] = []
            for ref in {r.uid: r for r in refs}.values():
                answers[ref.uid] = ""
                entry = kept.pop(ref.uid, None)
                paths: set[Path] = set()
                if check_ref(ref) is None:
                    paths.add(self._files.spec_path(ref.uid))
                if entry is not None and entry.cdi_file is not None:
                    paths.add(Path(entry.cdi_file))
                try:
                    for path in sorted(paths):
                        await asyncio.to_thread(self._files.remove_spec, path)
                except OSError as e:
                    log.error("claim %s: cannot remove its CDI spec: %s", ref, e)
                    answers[ref.uid] = f"cannot remove CDI spec: {e}"
                    if entry is not None:
                        kept[ref.uid] = entry
                    continue
                if entry is None:
                    log.info("claim %s unprepared (it was not prepared)", ref)
                else:
                    removed.append(ref.uid)
            if removed:
                try:
                    await asyncio.to_thread(self._files.save, kept)
                except OSError as e:
                    # The specs are gone; the kubelet asks again and the next save may succeed.
                    log.error("cannot write checkpoint %s: %s", self._files.checkpoint_path, e)
                    for uid in removed:
                        answers[uid] = f"cannot write checkpoint: {e}"
                    return answers
                for uid in removed:
                    entry = self._prepared[uid]
                    log.info("claim %s unprepared: %s", entry.claim, entry.summary())
                self._prepared = kept
        return answers


async def _restore(files: ClaimFiles, entry: Checkpointed) -> None:
    """Write a prepared claim's CDI spec again if it is gone (a reboot empties /var/run)."""
    try:
        if await asyncio.to_thread(files.restore, entry):
            log.warning(
                "claim %s: CDI spec %s was gone, written again", entry.claim, entry.cdi_file
            )
    except OSError as e:
        log.error("claim %s: cannot write CDI spec %s again: %s", entry.claim, entry.cdi_file, e)


def _refs(claims: Sequence[pb.Claim]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


class DraServicer:
    """Implements k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin (see api.proto): translation only."""

    def __init__(self, *, preparer: ClaimPreparer, settings: DraPluginSettings) -> None:
        self._preparer = preparer
        self._settings = settings

    async def _check_size(self, claims: Sequence[pb.Claim], context: Any) -> None:
        if len(claims) > self._settings.max_claims_per_call:
            message = (
                f"{len(claims)} claims in one call, at most "
                f"{self._settings.max_claims_per_call} are taken"
            )
            log.error("refused a call: %s", message)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    async def NodePrepareResources(
        self, request: pb.NodePrepareResourcesRequest, context: Any
    ) -> pb.NodePrepareResourcesResponse:
        await self._check_size(request.claims, context)
        answers = await self._preparer.prepare(_refs(request.claims))
        response = pb.NodePrepareResourcesResponse()
        for uid, answer in answers.items():
            claim = response.claims[uid]  # a message map makes the entry on first access
            if isinstance(answer, str):
                claim.error = answer
                continue
            for device in answer.devices:
                claim.devices.add(
                    request_names=device.request_names,
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=device.cdi_device_ids,
                )
        return response

    async def NodeUnprepareResources(
        self, request: pb.NodeUnprepareResourcesRequest, context: Any
    ) -> pb.NodeUnprepareResourcesResponse:
        await self._check_size(request.claims, context)
        answers = await self._preparer.unprepare(_refs(request.claims))
        response = pb.NodeUnprepareResourcesResponse()
        for uid, error in answers.items():
            response.claims[uid].error = error
        return response


class RegistrationServicer:
    """Implements pluginregistration.Registration for the kubelet's plugin watcher."""

    def __init__(
        self, *, settings: DraPluginSettings, registered: asyncio.Event | None = None
    ) -> None:
        self._settings = settings
        self._registered = registered

    def info(self) -> registration_pb2.PluginInfo:
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._settings.driver,
            endpoint=str(self._settings.dra_socket_path),
            supported_versions=[DRA_SERVICE],
        )

    async def GetInfo(
        self, request: registration_pb2.InfoRequest, context: Any
    ) -> registration_pb2.PluginInfo:
        return self.info()

    async def NotifyRegistrationStatus(
        self, request: registration_pb2.RegistrationStatus, context: Any
    ) -> registration_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info(
                "kubelet registered DRA driver %s (%s at %s)",
                self._settings.driver,
                DRA_SERVICE,
                self._settings.dra_socket_path,
            )
            if self._registered is not None:
                self._registered.set()
        else:
            log.error("kubelet refused DRA driver %s: %s", self._settings.driver, request.error)
        return registration_pb2.RegistrationStatusResponse()


async def _start_server(
    path: Path, add: Callable[[grpc.aio.Server], None], settings: DraPluginSettings
) -> tuple[grpc.aio.Server, FileId]:
    """A started gRPC server on ``path``, bounded as the settings say (a stale socket there is
    removed first). Raises OSError or RuntimeError when it cannot bind."""
    return await sockets.start_unix_server(
        path,
        add,
        options=[
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
        ],
        maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
        mode=SOCKET_MODE,
    )


def _add_dra(servicer: DraServicer, server: grpc.aio.Server) -> None:
    api_pb2_grpc.add_DRAPluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def _add_registration(servicer: RegistrationServicer, server: grpc.aio.Server) -> None:
    registration_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def _make_dirs(settings: DraPluginSettings) -> None:
    settings.registry_dir.mkdir(parents=True, exist_ok=True)
    settings.plugin_dir.mkdir(mode=PLUGIN_DIR_MODE, parents=True, exist_ok=True)


async def run_kubelet_plugin(
    *,
    source: DeviceSource,
    claims: ClaimReader,
    settings: DraPluginSettings,
    ready: asyncio.Event | None = None,
    registered: asyncio.Event | None = None,
) -> None:
    """Serve the DRA plugin until cancelled; ``ready`` is set once both sockets serve,
    ``registered`` once the kubelet reports the plugin registered.

    Raises InvalidInput at once for unusable settings, OSError for a checkpoint that exists but
    cannot be read. Sockets that cannot be bound are retried with backoff, so the rest of the
    agent keeps running. Both sockets are removed on the way out (the kubelet deregisters).
    """
    problems = settings.validate()
    if problems:
        raise InvalidInput(problems)
    preparer = await ClaimPreparer.open(source=source, claims=claims, settings=settings)
    dra = DraServicer(preparer=preparer, settings=settings)
    reg = RegistrationServicer(settings=settings, registered=registered)
    delay = settings.serve_backoff_s
    while True:
        started: list[tuple[grpc.aio.Server, Path, FileId]] = []
        try:
            await asyncio.to_thread(_make_dirs, settings)
            for path, add in (
                (settings.dra_socket_path, functools.partial(_add_dra, dra)),
                (settings.registration_socket_path, functools.partial(_add_registration, reg)),
            ):
                server, ours = await _start_server(path, add, settings)
                started.append((server, path, ours))
            if ready is not None:
                ready.set()
            await asyncio.get_running_loop().create_future()  # until cancelled
        except (OSError, RuntimeError) as e:
            log.error("cannot serve the DRA plugin, trying again in %.1f s: %s", delay, e)
        finally:
            # The registration socket first: the kubelet stops sending calls, then the DRA one.
            for server, path, ours in reversed(started):
                with contextlib.suppress(Exception):
                    await server.stop(settings.stop_grace_s)
                sockets.remove_if_ours(path, ours)
        await asyncio.sleep(delay)
        delay = min(delay * 2, settings.serve_backoff_max_s)
