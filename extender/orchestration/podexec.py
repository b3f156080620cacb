"""Issuing a command into a pod: the ``pods/exec`` subresource over a websocket
(``v4.channel.k8s.io``: stdout and stderr on channels 1 and 2, the exit status on channel 3).

:class:`Executor` is the seam: :class:`KubeExec` talks to the API server, :class:`NullExecutor`
only logs (a dry run), and :mod:`extender.orchestration.testing` has a scripted fake.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.stream import WsApiClient

from common.errors import Unavailable

log = logging.getLogger(__name__)

OUTPUT_TAIL = 2000  # characters of stdout+stderr kept for the logs and the record


@dataclass(frozen=True)
class ExecRequest:
    namespace: str
    pod: str
    argv: tuple[str, ...]
    timeout_s: float
    container: str | None = None
    job: str = ""
    command: str = ""
    attempt: int = 1


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    output: str = ""  # the tail of stdout and stderr, interleaved as received

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class _Tail:
    """The last ``keep`` characters of a stream of text, in bounded memory (a command may
    write for hours; only its tail goes to the logs and the record)."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._parts: list[str] = []
        self._size = 0

    def add(self, text: str) -> None:
        self._parts.append(text)
        self._size += len(text)
        if self._size > 2 * self._keep:
            kept = self.text()
            self._parts, self._size = [kept], len(kept)

    def text(self) -> str:
        return "".join(self._parts)[-self._keep :]


class Executor(Protocol):
    async def execute(self, request: ExecRequest) -> ExecResult:
        """Run the command to its end; raises Unavailable when it could not be run at all."""
        ...


class NullExecutor:
    """Logs each command and reports success: a dry run of a dependency file."""

    async def execute(self, request: ExecRequest) -> ExecResult:
        log.info(
            "dry run: would exec in %s/%s: %s", request.namespace, request.pod, list(request.argv)
        )
        return ExecResult(0, "")


def exit_code_of(status: dict[str, Any]) -> tuple[int, str]:
    """The exit code in a channel-3 Status, and its message (-1 when the command never ran)."""
    if status.get("status") == "Success":
        return 0, ""
    message = str(status.get("message", ""))
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message")), message
                except (TypeError, ValueError):
                    break
    return -1, message or json.dumps(status)


class KubeExec:
    """pods/exec through the API server (needs ``create`` on ``pods/exec``)."""

    def __init__(self, api: WsApiClient) -> None:
        self._api = api
        self._core = client.CoreV1Api(api_client=api)

    @classmethod
    async def connect(cls, kubeconfig: Path | None = None) -> KubeExec:
        cfg = client.Configuration()
        if kubeconfig is None:
            try:
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
                return cls(WsApiClient(configuration=cfg))
            except config.ConfigException:
                pass
        await config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig else None, client_configuration=cfg
        )
        return cls(WsApiClient(configuration=cfg))

    async def close(self) -> None:
        await self._api.close()

    async def execute(self, request: ExecRequest) -> ExecResult:
        kwargs: dict[str, Any] = {}
        if request.container:
            kwargs["container"] = request.container
        output = _Tail(OUTPUT_TAIL)
        status: dict[str, Any] | None = None
        try:
            async with asyncio.timeout(request.timeout_s):
                # The generated signature says str; the websocket client expands a list into
                # one ``command`` parameter per argument (argv, no shell).
                core: Any = self._core
                ctx = await core.connect_get_namespaced_pod_exec(
                    request.pod,
                    request.namespace,
                    command=list(request.argv),
                    stdin=False,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    _preload_content=False,
                    **kwargs,
                )
                async with ctx as ws:
                    async for msg in ws:
                        if msg.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                            break
                        data = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
                        if len(data) < 2:
                            continue
                        channel, payload = data[0], data[1:].decode(errors="replace")
                        if channel in (1, 2):
                            output.add(payload)
                        elif channel == 3:
                            status = json.loads(payload)
        except TimeoutError:
            tail = output.text()
            return ExecResult(-1, f"timed out after {request.timeout_s:g} s; {tail}")
        except client.ApiException as e:
            raise Unavailable(f"exec in {request.namespace}/{request.pod}: {e.reason}") from e
        except (aiohttp.ClientError, OSError, ValueError) as e:
            # A refused upgrade (pod gone, not running, container unknown) lands here too.
            raise Unavailable(f"exec in {request.namespace}/{request.pod}: {e}") from e
        tail = output.text()
        if status is None:
            return ExecResult(-1, f"the exec stream ended without an exit status; {tail}")
        code, message = exit_code_of(status)
        if code == -1 and message:
            tail = f"{message}; {tail}" if tail else message
        return ExecResult(code, tail)
