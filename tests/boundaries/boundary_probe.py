"""Run in a fresh interpreter: exercise gradian's light paths and report forbidden modules.

Usage: python boundary_probe.py [--block]
--block installs a sys.meta_path finder that refuses the forbidden names, so any attempt to
import them fails loudly instead of silently succeeding because the package happens to be installed.
Exit 0 when clean; 1 with a JSON report on stdout otherwise.
"""

from __future__ import annotations

import importlib.abc
import json
import sys

FORBIDDEN = ("trl", "unsloth", "bitsandbytes", "xformers")


class BlockForbidden(importlib.abc.MetaPathFinder):
    """Refuse to import any forbidden top-level package."""

    attempts: list[str] = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in FORBIDDEN:
            self.attempts.append(fullname)
            raise ImportError(f"{fullname} is blocked by the import-boundary probe")
        return None


def main() -> int:
    blocker = BlockForbidden()
    if "--block" in sys.argv:
        sys.meta_path.insert(0, blocker)
    import gradian
    from gradian.cli.app import main as cli
    from gradian.plugins import get_plugins

    help_code = cli(["--help"])
    plugins = get_plugins()
    records = plugins.records_by_plugin()
    listed = {
        "trainers": {name: spec.unavailable_reason() for name, spec in plugins.trainers().items()},
        "readers": sorted(plugins.run_log_readers()),
        "checks": sorted(plugins.audit_checks()),
        "codecs": sorted(plugins.storage_codecs()),
    }
    report = {
        "gradian": gradian.__version__,
        "help_exit_code": help_code,
        "plugins": sorted(records),
        "records": listed,
        "failures": [f"{i.name} ({i.distribution}): {i.error}" for i in plugins.infos() if i.status == "failed"],
        "blocked_attempts": BlockForbidden.attempts,
        "leaked": sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN),
    }
    clean = not (report["leaked"] or report["failures"] or report["blocked_attempts"]) and help_code == 0
    print(json.dumps(report))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
