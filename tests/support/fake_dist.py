"""Fake an installed distribution (a dist-info folder on sys.path) instead of installing one."""

from __future__ import annotations

from pathlib import Path


def write_distribution(root: Path, name: str, entry_points: dict[str, str], modules: dict[str, str],
                       version: str = "9.9.9") -> Path:
    """Write plugin modules and a dist-info with entry points in group `gradian` under root."""
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source, encoding="utf-8")
    dist_info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    lines = ["[gradian]"] + [f"{ep} = {target}" for ep, target in entry_points.items()]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root
