"""`gradian doctor`: every section, the supported-window logic, warnings that never fail, no trl/unsloth import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from packaging.specifiers import SpecifierSet

from gradian import doctor
from gradian.doctor import NOT_INSTALLED, OK, OUTSIDE, UNPARSEABLE, collect, read_window, render, window_status

SECTIONS = {"header", "gradian", "python", "platform", "packages", "devices", "determinism", "trainers", "plugins",
            "embedded_model", "warnings"}


# --- the window, as a pure function -------------------------------------------------------------


@pytest.mark.parametrize(("version", "spec", "status"), [
    ("2.13.0+cpu", ">=2.4,<2.14", OK),  # a local build counts as its public version
    ("2.13.0", ">=2.4,<2.14", OK),
    ("2.14.0", ">=2.4,<2.14", OUTSIDE),
    ("2.14.0+cu121", ">=2.4,<2.14", OUTSIDE),
    ("2.3.1", ">=2.4,<2.14", OUTSIDE),
    ("5.24.1.dev0", ">=4.51,<5.25", OK),  # a dev build inside the bounds is inside
    ("5.25.0rc1", ">=4.51,<5.25", OUTSIDE),
    ("1.17.0", "<1.17", OUTSIDE),
    (None, ">=2.4", NOT_INSTALLED),
    ("not-a-version", ">=2.4", UNPARSEABLE),
])
def test_window_status(version, spec, status):
    assert window_status(version, SpecifierSet(spec)) == status


def test_no_window_means_ok_when_installed():
    assert window_status("3.1.1", None) == OK
    assert window_status(None, None) == NOT_INSTALLED


def test_read_window_parses_requirement_lines_and_skips_comments():
    window = read_window("# comment\n\ntorch>=2.4,<2.14  # trailing\nPyYAML>=6\n")
    assert set(window) == {"torch", "pyyaml"}
    assert window["torch"].contains("2.13.0+cpu")


def test_the_shipped_window_covers_the_core_stack():
    window = read_window()
    assert {"torch", "transformers", "peft", "trl"} <= set(window)
    assert all(isinstance(spec, SpecifierSet) and str(spec) for spec in window.values())


# --- the report ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def report():
    return collect()


def test_report_has_every_section_and_is_json(report):
    assert set(report) == SECTIONS
    assert report["header"] == "Paste this output into your Gradian issue."
    assert not any(isinstance(v, dict) and set(v) == {"error"} for v in report.values())
    assert json.loads(json.dumps(report)) == report


def test_packages_are_read_from_metadata_against_the_window(report):
    import importlib_metadata

    rows = {row["name"]: row for row in report["packages"]}
    assert set(rows) == set(doctor.PACKAGES)
    assert rows["torch"]["version"] == importlib_metadata.version("torch")
    assert rows["torch"]["window"] == ">=2.4,<2.14"
    assert rows["trl"]["status"] in (OK, OUTSIDE)  # installed here, read without importing it


def test_an_out_of_window_version_is_marked_and_warned_but_doctor_still_succeeds():
    report = collect(window={"torch": SpecifierSet("<2.0"), "numpy": SpecifierSet(">=1.0")})
    rows = {row["name"]: row for row in report["packages"]}
    assert rows["torch"]["status"] == OUTSIDE
    assert rows["numpy"]["status"] == OK
    assert any(line.startswith("torch ") and "outside window" in line for line in report["warnings"])
    assert "outside window" in render(report)


def test_devices_and_determinism(report, monkeypatch):
    import os

    import torch

    devices = report["devices"]
    assert devices["cpu_count"] == os.cpu_count() and devices["torch_threads"] == torch.get_num_threads()
    assert devices["cuda"]["available"] == torch.cuda.is_available()
    assert len(devices["cuda"]["devices"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    from gradian.model.placement import resolve_placement

    assert devices["auto"] == str(resolve_placement())  # what --device auto --dtype auto picks, e.g. "cpu float32"
    assert set(report["determinism"]["seeds"]) == {"grads.seed", "evaluation.seed", "attribution.seed", "train.seed"}

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert collect()["determinism"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_seeds_come_from_the_config():
    from gradian.config import load_config

    seeds = collect(load_config(None, ("grads.seed=7", "train.seed=3")))["determinism"]["seeds"]
    assert seeds == {"grads.seed": 7, "evaluation.seed": 0, "attribution.seed": 0, "train.seed": 3}


def test_every_trainer_backend_is_listed_with_its_distribution_and_reason(report):
    import torch

    trainers = {row["name"]: row for row in report["trainers"]}
    assert trainers["hf"] == {"name": "hf", "distribution": "gradian-trainer-hf", "available": True, "reason": None}
    assert trainers["trl"]["distribution"] == "gradian-trainer-trl"
    if not torch.cuda.is_available():
        assert trainers["unsloth"]["available"] is False and "CUDA" in trainers["unsloth"]["reason"]


def test_plugins_and_embedded_model_sections(report):
    loaded = {row["name"]: row["distribution"] for row in report["plugins"]["loaded"]}
    assert loaded["core"] == "gradian-core"
    assert report["plugins"]["failures"] == []
    assert {"package_installed", "gguf_installed", "gguf_file", "cache_path", "cached", "size_bytes"} <= set(
        report["embedded_model"])


# --- broken environments are reported, never fatal ----------------------------------------------


def _install_plugin_set(monkeypatch, plugin_set):
    import gradian.plugins

    monkeypatch.setattr(gradian.plugins, "_plugins", plugin_set)


def test_a_plugin_that_fails_to_load_is_listed_and_warned(monkeypatch, capsys):
    import importlib_metadata

    from gradian.cli.app import main
    from gradian.plugins import load_plugins

    broken = importlib_metadata.EntryPoint(name="broken", value="gradian_no_such_module_xyz", group="gradian")
    _install_plugin_set(monkeypatch, load_plugins(autoload=True, entry_points=[broken]))
    report = collect()
    assert report["plugins"]["failures"][0]["name"] == "broken"
    assert "ModuleNotFoundError" in report["plugins"]["failures"][0]["error"]
    assert any("plugin broken" in line for line in report["warnings"])

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "failed: ModuleNotFoundError" in out and "Warnings" in out


def test_clashing_trainer_plugins_do_not_stop_doctor(monkeypatch):
    from gradian.hookspecs import hookimpl
    from gradian.plugins import PluginSet
    from gradian.records import TrainerSpec

    class Clash:
        @hookimpl
        def gradian_trainers(self):
            return [TrainerSpec(name="hf", summary="a clash", load="x:y")]

    plugins = PluginSet()
    plugins.register(Clash(), "one", "dist-one")
    plugins.register(Clash(), "two", "dist-two")
    _install_plugin_set(monkeypatch, plugins)
    report = collect()
    assert "dist-one" in report["trainers"]["error"] and "dist-two" in report["trainers"]["error"]
    assert any(line.startswith("trainers: could not be collected") for line in report["warnings"])
    assert "Trainer backends" in render(report)


# --- rendering and the CLI ----------------------------------------------------------------------


def test_render_has_the_header_first_and_every_section(report):
    text = render(report)
    assert text.splitlines()[0] == "Paste this output into your Gradian issue."
    for title in ("Environment", "Packages vs the supported window", "Devices", "Determinism", "Trainer backends",
                  "Plugins", "Embedded model"):
        assert title in text
    assert "\x1b[" not in text
    assert all(line == line.rstrip() for line in text.splitlines())


def test_cli_json_and_set(capsys):
    from gradian.cli.app import main

    assert main(["doctor", "--json", "--set", "evaluation.seed=11"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == SECTIONS
    assert report["determinism"]["seeds"]["evaluation.seed"] == 11


def test_cli_bad_set_is_one_line_exit_2(capsys):
    from gradian.cli.app import main

    assert main(["doctor", "--set", "grads.seed=-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "grads.seed" in err


def test_doctor_never_imports_trl_or_unsloth():
    code = (
        "import contextlib, io, json, sys\n"
        "from gradian.cli.app import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    rc = main(['doctor', '--json'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('trl', 'unsloth'))\n"
        "print(json.dumps({'rc': rc, 'report': json.loads(out.getvalue()), 'heavy': heavy}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout.splitlines()[-1])
    assert payload["rc"] == 0
    assert {row["name"] for row in payload["report"]["trainers"]} >= {"hf", "trl", "unsloth"}
    assert payload["heavy"] == []
