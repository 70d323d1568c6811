"""Every hook Gradian calls: the one place they are declared.

Each hook is ``gradian_<plural noun>()`` and yields frozen records from :mod:`gradian.records`.
Heavy code stays out of plugin modules: a record names it as a ``"module:attr"`` string or holds a
small callable that imports what it needs when called.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from gradian.records import AuditCheck, CodecSpec, ConfigSection, RunLogReaderSpec, TrainerSpec

PROJECT_NAME = "gradian"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def gradian_trainers() -> Iterable[TrainerSpec]:
    """Register training backends for ``gradian train``, ``verify`` and ``inject``.

    Called once when the plugin manager collects trainers. ``load`` is imported only when the
    backend is used, so the plugin module itself must not import the training library.

    Example::

        @gradian.hookimpl
        def gradian_trainers():
            yield TrainerSpec(
                name="my-trainer",
                summary="my training loop on pre-encoded data",
                load="my_plugin.backend:MyTrainer",
                requires=("transformers",),
            )
    """


@hookspec
def gradian_run_log_readers() -> Iterable[RunLogReaderSpec]:
    """Register readers that turn a run directory into a :class:`~gradian.records.RunArtifact`.

    Called when ``gradian diagnose --run`` needs a reader. Every reader's ``sniff(path)`` returns a
    confidence in [0, 1]; the highest non-zero one reads the directory unless ``--run-format`` names one.

    Example::

        @gradian.hookimpl
        def gradian_run_log_readers():
            yield RunLogReaderSpec(
                name="my-loop",
                summary="my training loop's run.log",
                sniff=lambda path: 1.0 if (path / "run.log").is_file() else 0.0,
                read=read_my_loop,
                looks_for=("run.log",),
            )
    """


@hookspec
def gradian_audit_checks() -> Iterable[AuditCheck]:
    """Register audit checks for ``gradian diagnose``.

    Called once per diagnose run. A check declares what it ``needs``; checks whose needs are not met
    are listed as skipped with the reason rather than run.

    Example::

        @gradian.hookimpl
        def gradian_audit_checks():
            yield AuditCheck(
                id="lr_too_high_for_lora",
                family="config",
                severity="warning",
                summary="learning rate too high for a LoRA run",
                fix="use 1e-4 to 2e-4",
                needs=frozenset({"run_config"}),
                run=check_lr,
            )
    """


@hookspec
def gradian_storage_codecs() -> Iterable[CodecSpec]:
    """Register storage codecs for gradient-index shards.

    Called when an index is written or opened; the manifest records the codec name, so an index is
    always read back with the codec that wrote it.

    Example::

        @gradian.hookimpl
        def gradian_storage_codecs():
            yield CodecSpec(name="my-npy", summary="memory-mapped .npy", suffix=".npy",
                            write=write_npy, read=open_npy_memmap)
    """


@hookspec
def gradian_config_sections() -> Iterable[ConfigSection]:
    """Declare config sections a plugin owns, read by its code as ``config.<name>.<key>``.

    Called when a config is built or listed. Each section's keys are set in YAML and with
    ``--set name.key=value``, checked against their types and ranges like the core's own, and
    listed by ``gradian config --list`` with the distribution that declares them. A name taken
    by the core or by another plugin is refused, naming both distributions.

    Example::

        from dataclasses import dataclass

        from gradian.config import option

        @dataclass(frozen=True)
        class MyChecksSettings:
            max_rows: int = option(100_000, "rows above which my_check warns", min=1)

        @gradian.hookimpl
        def gradian_config_sections():
            yield ConfigSection(name="my_checks", summary="thresholds of my checks", settings=MyChecksSettings)
    """
