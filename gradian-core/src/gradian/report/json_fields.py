"""Typed reads of one JSON object of report.json, each naming the field's path when it is missing or mistyped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from gradian.data.formats import json_type
from gradian.errors import ReportError

REWRITE = "rerun gradian attribute to rewrite the report"


class JsonObject:
    """A JSON object at ``where`` (a dotted path such as ``clusters.ranked[2]``) in the document ``source``."""

    def __init__(self, value: Mapping[str, Any], where: str, source: str) -> None:
        self.value = value
        self.where = where
        self.source = source

    def has(self, key: str) -> bool:
        """True when the object holds ``key`` (null included)."""
        return key in self.value

    def text(self, key: str) -> str:
        """A string."""
        return self._typed(key, str, "a string")

    def optional_text(self, key: str, *, absent_ok: bool = False) -> str | None:
        """A string or null; with ``absent_ok`` a missing key reads as null."""
        if absent_ok and key not in self.value:
            return None
        return self._typed(key, str, "a string or null", nullable=True)

    def texts(self, key: str) -> tuple[str, ...]:
        """An array of strings."""
        values = self._typed(key, list, "an array of strings")
        for position, value in enumerate(values):
            if not isinstance(value, str):
                self._mistyped(f"{self._path(key)}[{position}]", value, "a string")
        return tuple(values)

    def integer(self, key: str) -> int:
        """A whole number."""
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            self._mistyped(self._path(key), value, "a whole number")
        return value

    def number(self, key: str) -> float | None:
        """A number, or null (the writer turns NaN and infinities into null)."""
        value = self._get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._mistyped(self._path(key), value, "a number or null")
        return float(value)

    def flag(self, key: str) -> bool:
        """true or false."""
        return self._typed(key, bool, "true or false")

    def mapping(self, key: str) -> dict[str, Any]:
        """An object kept whole (a config, a method's knobs), for code that reads it on its own terms."""
        return dict(self._typed(key, Mapping, "an object"))

    def object(self, key: str) -> JsonObject:
        """A nested object."""
        return JsonObject(self._typed(key, Mapping, "an object"), self._path(key), self.source)

    def optional_object(self, key: str) -> JsonObject | None:
        """A nested object, or None for null."""
        value = self._typed(key, Mapping, "an object or null", nullable=True)
        return None if value is None else JsonObject(value, self._path(key), self.source)

    def objects(self, key: str) -> list[JsonObject]:
        """An array of objects."""
        values = self._typed(key, list, "an array")
        rows = []
        for position, value in enumerate(values):
            where = f"{self._path(key)}[{position}]"
            if not isinstance(value, Mapping):
                self._mistyped(where, value, "an object")
            rows.append(JsonObject(value, where, self.source))
        return rows

    def _typed(self, key: str, kind: type, expected: str, *, nullable: bool = False) -> Any:
        value = self._get(key)
        if (value is None and nullable) or isinstance(value, kind):
            return value
        self._mistyped(self._path(key), value, expected)

    def _get(self, key: str) -> Any:
        if key not in self.value:
            raise ReportError(f"{self.source}: {self._path(key)} is missing", REWRITE)
        return self.value[key]

    def _path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _mistyped(self, where: str, value: Any, expected: str) -> NoReturn:
        raise ReportError(f"{self.source}: {where} is {json_type(value)}, expected {expected}", REWRITE)
