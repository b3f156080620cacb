"""A faithful in-memory fake of the rotation's Secrets (controller.Secrets): resourceVersions,
create conflicts and stale replaces as the API server answers them."""

from __future__ import annotations

from common.errors import Conflict


class FakeSecrets:
    def __init__(self) -> None:
        self.data: dict[str, dict[str, bytes]] = {}
        self.versions: dict[str, int] = {}
        self.writes = 0

    async def get(self, name: str) -> tuple[dict[str, bytes], str] | None:
        if name not in self.data:
            return None
        return dict(self.data[name]), str(self.versions[name])

    async def put(self, name: str, data: dict[str, bytes], *, resource_version: str | None) -> None:
        if resource_version is None and name in self.data:
            raise Conflict(f"secret {name} already exists")
        if resource_version is not None and resource_version != str(self.versions.get(name)):
            raise Conflict(f"secret {name}: the object has been modified")
        self.data[name] = dict(data)
        self.versions[name] = self.versions.get(name, 0) + 1
        self.writes += 1
