"""`gradian doctor`: the environment report a user pastes into an issue; it warns, it never fails.

Versions come from package metadata, so nothing heavy is imported to read them; trl and unsloth
are never imported (unsloth patches torch and transformers on import). torch is imported only to
list devices and read the determinism switches.
"""

from __future__ import annotations

import io
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import importlib_metadata
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from gradian import __version__
from gradian.config import GradianConfig
from gradian.errors import GradianError
from gradian.model.embedded import cache_state
from gradian.model.placement import resolve_placement
from gradian.plugins import CORE_DISTRIBUTION, get_plugins

SectionT = TypeVar("SectionT")

HEADER = "Paste this output into your Gradian issue."
PACKAGES = (
    "torch", "transformers", "peft", "trl", "pluggy", "typer", "numpy", "gguf",
    "datasets", "datasketch", "matplotlib", "bm25s", "unsloth", "accelerate",
)
SEED_KEYS = ("grads.seed", "evaluation.seed", "attribution.seed", "train.seed")
WINDOW_FILE = "supported_window.txt"

OK, OUTSIDE, NOT_INSTALLED, UNPARSEABLE = "ok", "outside window", "not installed", "unparseable version"


# --- the supported window -----------------------------------------------------------------------


def read_window(text: str | None = None) -> dict[str, SpecifierSet]:
    """The supported window as {canonical package name: SpecifierSet}, from constraints/supported_window.txt."""
    if text is None:
        text = (Path(__file__).parent / WINDOW_FILE).read_text()
    window = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            window[canonicalize_name(requirement.name)] = requirement.specifier
    return window


def window_status(version: str | None, specifier: SpecifierSet | None) -> str:
    """ok / outside window / not installed / unparseable version, for one installed version."""
    if version is None:
        return NOT_INSTALLED
    if specifier is None:
        return OK
    try:
        parsed = Version(version)
    except InvalidVersion:
        return UNPARSEABLE
    # Local labels (2.13.0+cpu) compare as their public version; a dev or rc build inside the
    # bounds counts as inside, which PEP 440's default (no prereleases) would not.
    return OK if specifier.contains(parsed, prereleases=True) else OUTSIDE


def _installed_version(name: str) -> str | None:
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return None


def _window_text(specifier: SpecifierSet) -> str:
    """A specifier set written lower bound first (">=2.4,<2.14"), as people read a range."""
    return ",".join(sorted((str(s) for s in specifier), key=lambda s: (not s.startswith(">"), s)))


def package_rows(window: dict[str, SpecifierSet] | None = None) -> list[dict[str, Any]]:
    """Each watched package: installed version, supported window and status."""
    window = read_window() if window is None else window
    rows = []
    for name in PACKAGES:
        version = _installed_version(name)
        specifier = window.get(canonicalize_name(name))
        rows.append({
            "name": name,
            "version": version,
            "window": _window_text(specifier) if specifier else None,
            "status": window_status(version, specifier),
        })
    return rows


# --- sections -----------------------------------------------------------------------------------


def _gradian_section() -> dict[str, Any]:
    # gradian-core and every distribution that registers a plugin (loaded or failed): the core names none of them
    found = {info.distribution for info in get_plugins().infos() if info.distribution != "unknown"}
    return {"version": __version__,
            "distributions": {d: _installed_version(d) for d in sorted(found | {CORE_DISTRIBUTION})}}


def _python_section() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def _platform_section() -> dict[str, Any]:
    return {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
            "platform": platform.platform()}


def _devices_section() -> dict[str, Any]:
    import torch

    cuda_devices = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            cuda_devices.append({"index": index, "name": props.name,
                                 "memory_gib": round(props.total_memory / 2**30, 1),
                                 "capability": f"{props.major}.{props.minor}"})
    mps = getattr(torch.backends, "mps", None)
    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": {"available": torch.cuda.is_available(), "torch_cuda_version": torch.version.cuda,
                 "devices": cuda_devices},
        "mps": {"available": bool(mps is not None and mps.is_available())},
        "auto": _auto_placement(),
    }


def _auto_placement() -> str:
    """What --device auto --dtype auto picks in this process, or why it cannot pick."""
    try:
        return str(resolve_placement())
    except GradianError as error:
        return f"error: {error.one_line()}"


def _determinism_section(config: GradianConfig) -> dict[str, Any]:
    import torch

    data = config.to_dict()
    seeds = {}
    for key in SEED_KEYS:
        section, _, field = key.partition(".")
        seeds[key] = data[section][field]
    return {
        "torch_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED"),
        "seeds": seeds,
    }


def _trainers_section() -> list[dict[str, Any]]:
    plugins = get_plugins()
    rows = []
    for name, spec in sorted(plugins.trainers().items()):
        try:
            reason = spec.unavailable_reason()
        except Exception as error:  # a broken availability check is itself the answer
            reason = f"availability check failed: {type(error).__name__}: {error}"
        rows.append({
            "name": name,
            "distribution": plugins.distribution_of("gradian_trainers", name),
            "available": reason is None,
            "reason": reason,
        })
    return rows


def _plugins_section() -> dict[str, Any]:
    loaded, failed = [], []
    for info in get_plugins().infos():
        row = {"name": info.name, "distribution": info.distribution, "version": info.version}
        if info.status == "loaded":
            loaded.append({**row, "hooks": list(info.hooks)})
        else:
            failed.append({**row, "module": info.module, "error": info.error})
    return {"loaded": loaded, "failures": failed}


def _embedded_section() -> dict[str, Any]:
    return cache_state()


def _guarded(section: Callable[[], SectionT]) -> SectionT | dict[str, str]:
    """Run one section; a failure becomes the section's content, because doctor must always print."""
    try:
        return section()
    except Exception as error:
        return {"error": f"{type(error).__name__}: {' '.join(str(error).split())}"}


def collect(config: GradianConfig | None = None, *, window: dict[str, SpecifierSet] | None = None) -> dict[str, Any]:
    """The whole report as a JSON-ready dict; ``window`` replaces the shipped supported window."""
    if config is None:
        config = GradianConfig()
    report: dict[str, Any] = {
        "header": HEADER,
        "gradian": _guarded(_gradian_section),
        "python": _guarded(_python_section),
        "platform": _guarded(_platform_section),
        "packages": _guarded(lambda: package_rows(window)),
        "devices": _guarded(_devices_section),
        "determinism": _guarded(lambda: _determinism_section(config)),
        "trainers": _guarded(_trainers_section),
        "plugins": _guarded(_plugins_section),
        "embedded_model": _guarded(_embedded_section),
    }
    report["warnings"] = warnings(report)
    return report


def warnings(report: dict[str, Any]) -> list[str]:
    """The lines worth reading first: versions outside the window, broken plugins, failed sections."""
    found = []
    for name, value in report.items():
        if isinstance(value, dict) and set(value) == {"error"}:
            found.append(f"{name}: could not be collected ({value['error']})")
    packages = report.get("packages")
    if isinstance(packages, list):
        for row in packages:
            if row["status"] in (OUTSIDE, UNPARSEABLE):
                found.append(f"{row['name']} {row['version']} is {row['status']} ({row['window']})")
    plugins = report.get("plugins")
    if isinstance(plugins, dict):
        for failure in plugins.get("failures", ()):
            found.append(f"plugin {failure['name']} ({failure['distribution']}) failed to load: {failure['error']}")
    devices = report.get("devices")
    determinism = report.get("determinism")
    if (isinstance(devices, dict) and devices.get("cuda", {}).get("available") and isinstance(determinism, dict)
            and not determinism.get("CUBLAS_WORKSPACE_CONFIG")):
        found.append("CUDA is visible but CUBLAS_WORKSPACE_CONFIG is unset: GPU gradients may differ run to run "
                     "(export CUBLAS_WORKSPACE_CONFIG=:4096:8)")
    return found


# --- rendering ----------------------------------------------------------------------------------

_STATUS_STYLE = {OK: "green", OUTSIDE: "yellow", NOT_INSTALLED: "dim", UNPARSEABLE: "yellow"}


def render(report: dict[str, Any], *, color: bool = False, width: int = 100) -> str:
    """The report as text for a terminal or an issue (rich tables; ANSI colours only when asked)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=color, color_system="standard" if color else None,
                      highlight=False, soft_wrap=False)
    for renderable in _renderables(report):
        console.print(renderable)
    # rich pads every line to the console width; trailing blanks only get in the way of a paste.
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def _renderables(report: dict[str, Any]) -> list[RenderableType]:
    out: list[RenderableType] = [Text(report["header"], style="bold")]
    gradian, python, plat = report["gradian"], report["python"], report["platform"]
    out.append(_pairs("Environment", {
        "gradian": gradian.get("version", gradian.get("error")),
        **{f"  {d}": v or "not installed" for d, v in gradian.get("distributions", {}).items()},
        "python": f"{python.get('version')} ({python.get('implementation')}) {python.get('executable')}"
        if "error" not in python else python["error"],
        "platform": plat.get("platform", plat.get("error")),
    }))
    packages = report["packages"]
    if isinstance(packages, list):
        table = Table(title="Packages vs the supported window", title_justify="left")
        for column in ("package", "installed", "window", "status"):
            table.add_column(column)
        for row in packages:
            table.add_row(row["name"], row["version"] or "-", row["window"] or "any",
                          Text(row["status"], style=_STATUS_STYLE.get(row["status"], "")))
        out.append(table)
    else:
        out.append(_pairs("Packages", packages))
    out.append(_pairs("Devices", _device_lines(report["devices"])))
    out.append(_pairs("Determinism", _flatten(report["determinism"])))
    out.append(_trainers_table(report["trainers"]))
    out.append(_plugins_table(report["plugins"]))
    out.append(_pairs("Embedded model", _flatten(report["embedded_model"])))
    if report["warnings"]:
        out.append(Text("Warnings", style="bold yellow"))
        out.extend(Text(f"  ! {line}", style="yellow") for line in report["warnings"])
    else:
        out.append(Text("No warnings.", style="green"))
    return out


def _pairs(title: str, values: dict[str, Any]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")  # paths are pasted into issues whole, never cut with an ellipsis
    for key, value in values.items():
        if key.endswith("size_bytes") and isinstance(value, int):
            value = f"{value / 2**20:.1f} MiB"
        table.add_row(str(key), "-" if value is None else str(value))
    return table


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _device_lines(devices: dict[str, Any]) -> dict[str, Any]:
    if "error" in devices:
        return devices
    cuda = devices["cuda"]
    lines: dict[str, Any] = {
        "cpu": f"{devices['cpu_count']} cores, torch uses {devices['torch_threads']} threads",
        "cuda": f"available (CUDA {cuda['torch_cuda_version']})" if cuda["available"] else "not available",
    }
    for device in cuda["devices"]:
        lines[f"  cuda:{device['index']}"] = f"{device['name']}, {device['memory_gib']} GiB, sm {device['capability']}"
    lines["mps"] = "available" if devices["mps"]["available"] else "not available"
    lines["--device/--dtype auto"] = devices.get("auto", "unknown")
    return lines


def _trainers_table(trainers: list[dict[str, Any]] | dict[str, Any]) -> Table:
    if not isinstance(trainers, list):
        return _pairs("Trainer backends", trainers)
    table = Table(title="Trainer backends", title_justify="left")
    for column in ("backend", "distribution", "status"):
        table.add_column(column)
    for row in trainers:
        status = Text("available", style="green") if row["available"] else Text(f"unavailable: {row['reason']}",
                                                                                  style="yellow")
        table.add_row(row["name"], row["distribution"], status)
    return table


def _plugins_table(plugins: dict[str, Any]) -> Table:
    if "error" in plugins:
        return _pairs("Plugins", plugins)
    table = Table(title="Plugins", title_justify="left")
    for column in ("plugin", "distribution", "version", "status"):
        table.add_column(column)
    for row in plugins["loaded"]:
        table.add_row(row["name"], row["distribution"], row["version"], Text("loaded", style="green"))
    for row in plugins["failures"]:
        table.add_row(row["name"], row["distribution"], row["version"], Text(f"failed: {row['error']}", style="red"))
    return table
