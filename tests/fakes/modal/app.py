"""`modal.App` of the fake SDK: only `App.lookup`, with apps remembered in the fake cloud."""

from __future__ import annotations

import hashlib
import json

from modal import _cloud
from modal.exception import NotFoundError


class App:
    def __init__(self, name: str, app_id: str) -> None:
        self.name, self.app_id = name, app_id

    @staticmethod
    def lookup(name: str, *, environment_name: str | None = None, create_if_missing: bool = False) -> "App":
        _cloud.connect()
        registry = _cloud.config.root / "apps.json"
        apps = json.loads(registry.read_text()) if registry.exists() else {}
        if name not in apps:
            if not create_if_missing:
                raise NotFoundError(f"App '{name}' not found")
            apps[name] = "ap-" + hashlib.sha1(f"{_cloud.config.root}/{name}".encode()).hexdigest()[:22]
            registry.parent.mkdir(parents=True, exist_ok=True)
            registry.write_text(json.dumps(apps))
        return App(name, apps[name])
