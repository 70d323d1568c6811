"""The plugin manager: built-ins and entry points, load failures recorded, typed record getters.

Nothing outside this module calls ``pm.hook.*``. Records are collected implementation by
implementation so that every record knows which distribution gave it, which is what lets a
duplicate name be reported with both distributions named.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

import importlib_metadata
import pluggy

from gradian import hookspecs
from gradian.errors import PluginError
from gradian.records import AuditCheck, CodecSpec, ConfigSection, PluginInfo, RunLogReaderSpec, TrainerSpec

ENTRY_POINT_GROUP = "gradian"
DISABLE_AUTOLOAD_ENV = "GRADIAN_DISABLE_PLUGIN_AUTOLOAD"
CORE_DISTRIBUTION = "gradian-core"

# Built-ins are registered from this list exactly as entry points are, so they load even when
# autoloading is disabled (like pytest's own plugins under PYTEST_DISABLE_PLUGIN_AUTOLOAD).
DEFAULT_PLUGINS: tuple[tuple[str, str], ...] = (("core", "gradian.core_plugin"),)

R = TypeVar("R")

# Each registration hook, the record type it yields and the field that names a record.
RECORD_HOOKS: dict[str, tuple[type, str]] = {
    "gradian_trainers": (TrainerSpec, "name"),
    "gradian_run_log_readers": (RunLogReaderSpec, "name"),
    "gradian_audit_checks": (AuditCheck, "id"),
    "gradian_storage_codecs": (CodecSpec, "name"),
    "gradian_config_sections": (ConfigSection, "name"),
}


@dataclass
class _Origin:
    name: str
    distribution: str
    version: str
    module: str


@dataclass
class PluginSet:
    """A pluggy manager plus what Gradian knows about where each plugin came from."""

    pm: pluggy.PluginManager = field(default_factory=lambda: _new_manager())
    origins: dict[str, _Origin] = field(default_factory=dict)
    failures: list[PluginInfo] = field(default_factory=list)
    record_origins: dict[tuple[str, str], str] = field(default_factory=dict)
    # hook name -> its records: the hookspecs promise each registration hook is called once per plugin set
    collected: dict[str, dict[str, Any]] = field(default_factory=dict)

    def register(self, plugin: ModuleType | object, name: str, distribution: str, version: str = "") -> None:
        """Register a plugin object (usually a module) under a name, remembering its distribution."""
        if name in self.origins:
            other = self.origins[name].distribution
            raise PluginError(
                f"two plugins are named {name!r}: one from {other}, one from {distribution}",
                f"uninstall one of {other} and {distribution}",
            )
        module = getattr(plugin, "__name__", type(plugin).__name__)
        self.pm.register(plugin, name=name)
        self.collected.clear()  # a new plugin may add records to any hook
        self.origins[name] = _Origin(name, distribution, version, module)

    def record_failure(self, name: str, distribution: str, version: str, module: str, error: BaseException) -> None:
        """Remember a plugin that could not be loaded or whose hook raised."""
        message = (f"{type(error).__name__}: {error}".splitlines() or [type(error).__name__])[0]
        if any(f.name == name and f.error == message for f in self.failures):
            return  # the same hook collected twice fails the same way; list it once
        self.failures.append(
            PluginInfo(name, distribution, version, module, hooks=(), status="failed", error=message)
        )

    def infos(self) -> list[PluginInfo]:
        """Every registered plugin and every failed one, for `gradian plugins` and doctor."""
        rows = []
        for name, origin in self.origins.items():
            plugin = self.pm.get_plugin(name)
            hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or ()))
            rows.append(PluginInfo(name, origin.distribution, origin.version, origin.module, hooks, "loaded"))
        return rows + list(self.failures)

    def _records_per_plugin(self, hook_name: str, record_type: type[R]) -> Iterator[tuple[_Origin, list[R]]]:
        """Each plugin's records for one hook; a plugin whose hook raises is recorded and skipped."""
        hook = getattr(self.pm.hook, hook_name)
        for impl in reversed(hook.get_hookimpls()):  # registration order
            origin = self.origins.get(impl.plugin_name) or _Origin(impl.plugin_name, "unknown", "", "")
            try:
                records = list(impl.function() or ())
                for record in records:
                    if not isinstance(record, record_type):
                        raise TypeError(f"{hook_name} yielded {type(record).__name__}, not {record_type.__name__}")
            except Exception as error:  # a broken plugin is recorded, never fatal
                self.record_failure(origin.name, origin.distribution, origin.version, origin.module, error)
                continue
            yield origin, records

    def collect(self, hook_name: str, record_type: type[R], key: str) -> dict[str, R]:
        """Call one registration hook on every plugin (once; later calls reuse it) and index the records by ``key``."""
        if hook_name in self.collected:
            return dict(self.collected[hook_name])
        found: dict[str, tuple[R, str]] = {}
        for origin, records in self._records_per_plugin(hook_name, record_type):
            for record in records:
                record_name = getattr(record, key)
                if record_name in found:
                    other = found[record_name][1]
                    raise PluginError(
                        f"{hook_name}: {record_name!r} is registered by both {other} and {origin.distribution}",
                        f"uninstall one of {other} and {origin.distribution}",
                    )
                found[record_name] = (record, origin.distribution)
        for name, (_, distribution) in found.items():
            self.record_origins[(hook_name, name)] = distribution
        self.collected[hook_name] = {name: record for name, (record, _) in found.items()}
        return dict(self.collected[hook_name])

    def records_by_plugin(self) -> dict[str, dict[str, list[str]]]:
        """For each plugin, the names of the records each of its hooks yields."""
        table: dict[str, dict[str, list[str]]] = {name: {} for name in self.origins}
        for hook_name, (record_type, key) in RECORD_HOOKS.items():
            for origin, records in self._records_per_plugin(hook_name, record_type):
                table.setdefault(origin.name, {})[hook_name] = [getattr(r, key) for r in records]
        return table

    def distribution_of(self, hook_name: str, record_name: str) -> str:
        """The distribution that registered a record, once its hook has been collected."""
        return self.record_origins.get((hook_name, record_name), "unknown")

    # Typed getters: the only way the rest of Gradian reaches the hooks.

    def trainers(self) -> dict[str, TrainerSpec]:
        """Training backends by name."""
        return self.collect("gradian_trainers", TrainerSpec, "name")

    def run_log_readers(self) -> dict[str, RunLogReaderSpec]:
        """Run-log readers by name."""
        return self.collect("gradian_run_log_readers", RunLogReaderSpec, "name")

    def audit_checks(self) -> dict[str, AuditCheck]:
        """Audit checks by id."""
        return self.collect("gradian_audit_checks", AuditCheck, "id")

    def storage_codecs(self) -> dict[str, CodecSpec]:
        """Storage codecs by name."""
        return self.collect("gradian_storage_codecs", CodecSpec, "name")

    def config_sections(self) -> dict[str, ConfigSection]:
        """Config sections plugins declare, by name, in registration order."""
        return self.collect("gradian_config_sections", ConfigSection, "name")


def _new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def _load_defaults(plugins: PluginSet) -> None:
    version = _distribution_version(CORE_DISTRIBUTION)
    for name, module_name in DEFAULT_PLUGINS:
        plugins.register(importlib.import_module(module_name), name, CORE_DISTRIBUTION, version)


def _load_entry_points(plugins: PluginSet,
                      entry_points: Iterable[importlib_metadata.EntryPoint] | None = None) -> None:
    if entry_points is None:
        entry_points = importlib_metadata.entry_points(group=ENTRY_POINT_GROUP)
    builtin_modules = {module for _, module in DEFAULT_PLUGINS}
    for ep in sorted(entry_points, key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        distribution = dist.name if dist is not None else "unknown"
        version = dist.version if dist is not None else ""
        if ep.value in builtin_modules:
            continue  # gradian-core's own entry point: already registered as a built-in
        try:
            plugin = ep.load()
        except Exception as error:  # a broken plugin is recorded, never fatal
            plugins.record_failure(ep.name, distribution, version, ep.value, error)
            continue
        plugins.register(plugin, ep.name, distribution, version)


def _distribution_version(name: str) -> str:
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return ""


def load_plugins(autoload: bool | None = None,
                 entry_points: Iterable[importlib_metadata.EntryPoint] | None = None) -> PluginSet:
    """A fresh PluginSet with the built-ins and (unless disabled) every installed plugin."""
    if autoload is None:
        autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
    plugins = PluginSet()
    _load_defaults(plugins)
    if autoload:
        _load_entry_points(plugins, entry_points)
    return plugins


_lock = threading.Lock()
_plugins: PluginSet | None = None


def get_plugins() -> PluginSet:
    """The process-wide PluginSet, loaded on first use."""
    global _plugins
    with _lock:
        if _plugins is None:
            _plugins = load_plugins()
        return _plugins


def reset_plugins() -> None:
    """Forget the process-wide PluginSet (tests, and after installing a plugin in-process)."""
    global _plugins
    with _lock:
        _plugins = None
