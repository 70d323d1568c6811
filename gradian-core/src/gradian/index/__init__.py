"""The gradient index: build (sharded, resumable, distributed), manifest + index id, store (codecs), stats.

``build_index`` and ``Index`` import numpy (and torch, for building) when first used, so importing this
package stays cheap.
"""

from __future__ import annotations

from gradian.records import lazy_exports

_LAZY = {
    "build_index": "gradian.index.build:build_index",
    "default_index_dir": "gradian.index.build:default_index_dir",
    "Index": "gradian.index.store:Index",
    "open_index": "gradian.index.store:open_index",
    "Manifest": "gradian.index.manifest:Manifest",
    "read_manifest": "gradian.index.manifest:read_manifest",
    "FORMAT_VERSION": "gradian.index.manifest:FORMAT_VERSION",
    "PreconditionerStats": "gradian.index.stats:PreconditionerStats",
    "unit_rows": "gradian.index.dtypes:unit_rows",
}

__all__ = list(_LAZY)


__getattr__ = lazy_exports("gradian.index", _LAZY)
