"""How a family module declares its checks: a decorator that turns a function yielding Hits into an AuditCheck."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gradian.records import AuditCheck, Evidence, Family, Finding, Need, Severity


@dataclass(frozen=True)
class Hit:
    """What a check function reports; the registry adds the check id, default severity and fix."""

    message: str
    evidence: tuple[Evidence, ...] = ()
    severity: Severity | None = None  # escalation (e.g. warning -> error past a threshold)
    fix: str | None = None  # a fix specific to what was found


CheckFunction = Callable[[Any], Iterable[Hit]]


def _run(function: CheckFunction, check_id: str, severity: Severity, fix: str, ctx: Any) -> Iterator[Finding]:
    limit = ctx.config.diagnose.max_evidence
    for hit in function(ctx) or ():
        yield Finding(check_id, hit.severity or severity, hit.message, hit.fix or fix, capped(tuple(hit.evidence), limit))


def capped(evidence: tuple[Evidence, ...], limit: int) -> tuple[Evidence, ...]:
    """At most ``limit`` items, then one that counts the rest: a check may point at every row of a large dataset."""
    if len(evidence) <= limit:
        return evidence
    rest = len(evidence) - limit
    return evidence[:limit] + (Evidence(text=f"... and {rest} more", values={"omitted": rest}),)


class CheckFamily:
    """The checks of one family module, in declaration order."""

    def __init__(self, family: Family) -> None:
        self.family = family
        self.checks: list[AuditCheck] = []

    def check(self, id: str, severity: Severity, summary: str, fix: str, needs: Iterable[Need]) -> Callable[[CheckFunction], CheckFunction]:
        """Register the decorated function as the check ``id``."""

        def decorate(function: CheckFunction) -> CheckFunction:
            self.checks.append(AuditCheck(
                id=id, family=self.family, severity=severity, summary=summary, fix=fix, needs=frozenset(needs),
                run=functools.partial(_run, function, id, severity, fix),
            ))
            return function

        return decorate


def example_evidence(example: Any, text: str, **values: Any) -> Evidence:
    """Evidence pointing at one example (file:line and id)."""
    return Evidence(text=text, location=example.location, example_ids=(example.id,), values=values)


def group_evidence(examples: list[Any], text: str, **values: Any) -> Evidence:
    """Evidence pointing at a group of examples (location of the first)."""
    return Evidence(text=text, location=examples[0].location, example_ids=tuple(e.id for e in examples), values=values)


def point_evidence(ctx: Any, point: Any, text: str, **values: Any) -> Evidence:
    """Evidence pointing at one logged step."""
    return Evidence(text=text, location=ctx.metric_location(point), steps=(point.step,), values=values)


def config_evidence(ctx: Any, name: str, text: str, **values: Any) -> Evidence:
    """Evidence pointing at the file a run config field came from."""
    return Evidence(text=text, location=ctx.config_location(name), values=values)


def excerpt(text: str, width: int = 60) -> str:
    """One line of at most ``width`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def count(n: int, noun: str) -> str:
    """``n`` and the noun, plural when n != 1 (``1 row``, ``3 rows``)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
