"""`phalanx agent` as another release would run it: with the API version given first on
the command line, and fields this release does not know in what it sends the head
(registration, heartbeats, the processes in them). For tests and benchmarks of rolling
upgrades (LocalCluster.upgrade_agent(address, argv_prefix("1.99"))).

    python -m phalanx.testing.newer_agent 1.99 agent --head URL …
"""

from __future__ import annotations

import json
import sys
from typing import Any

from phalanx.api import version

NEW_REGISTER_FIELDS = {"numa_nodes": 2, "features": {"cgroups": "v2", "mig": False}}
NEW_HEARTBEAT_FIELDS = {"load_avg": [0.5, 0.4, 0.3], "disk_free_mb": 123456}
NEW_PROCESS_FIELDS = {"cgroup": "/phalanx/job", "rss_mb": 12}


def _with_new_fields(cls: type[Any], fields: dict[str, Any]) -> None:
    """Make `cls.model_dump_json` (what the agent sends) add `fields`, and new fields to
    each process it lists."""
    original = cls.model_dump_json

    def dump(self: Any, **kwargs: Any) -> str:
        data = json.loads(original(self, **kwargs))
        data.update(fields)
        delta = data.get("delta") or {}
        for process in [*(data.get("processes") or []), *delta.get("processes", [])]:
            process.update(NEW_PROCESS_FIELDS)
        return json.dumps(data)

    setattr(cls, "model_dump_json", dump)  # noqa: B010 (mypy forbids assigning a method)


def argv_prefix(api_version: str) -> list[str]:
    """What runs `phalanx` as a release speaking `api_version` ("1.99"): put "agent" and
    its flags after it."""
    return [sys.executable, "-m", "phalanx.testing.newer_agent", api_version]


def main() -> None:
    version.API_VERSION = sys.argv.pop(1)  # before anything reads it
    from phalanx.api import models

    _with_new_fields(models.RegisterRequest, NEW_REGISTER_FIELDS)
    _with_new_fields(models.Heartbeat, NEW_HEARTBEAT_FIELDS)
    from phalanx.cli.main import app

    app(prog_name="phalanx")


if __name__ == "__main__":
    main()
