"""gearshift/env.py: each switch's default, its allowed values (case-insensitive), a clear
error naming the variable for any other value, and the modules that read a switch at
import honouring it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gearshift import env


@pytest.mark.parametrize("switch", [s for s in env.SWITCHES if s.choices])
def test_a_bad_value_names_the_variable(monkeypatch, switch):
    monkeypatch.setenv(switch.name, "sometimes")
    with pytest.raises(ValueError, match=switch.name):
        switch.get()
    with pytest.raises(ValueError, match=switch.name):
        switch.get("sometimes")  # a caller's own value is checked the same way


def test_defaults_choices_and_overrides(monkeypatch):
    for switch in env.SWITCHES:
        monkeypatch.delenv(switch.name, raising=False)
        assert switch.get() == switch.default
        assert not switch.choices or switch.default in switch.choices
        assert switch.name.startswith("GEARSHIFT_") and switch.doc
    monkeypatch.setenv("GEARSHIFT_PDL", " Off ")
    assert env.PDL.get() == "off"
    assert env.PDL.get("ON") == "on"  # an override wins over the environment
    monkeypatch.setenv("GEARSHIFT_PDL", "")  # empty counts as unset
    assert env.PDL.get() == "auto"
    monkeypatch.setenv("GEARSHIFT_API_KEY", "Secret Key")  # any string, kept as it is
    assert env.API_KEY.get() == "Secret Key"


_IMPORTS = r"""
import importlib, json, os, sys
report = {}
for var, value, module, attr in json.loads(sys.argv[1]):
    os.environ[var] = value
    try:
        report[f"{var}={value}"] = repr(getattr(importlib.import_module(module), attr))
    except ValueError as e:
        report[f"{var}={value}"] = f"ValueError: {e}"
    del os.environ[var]
    sys.modules.pop(module, None)
print(json.dumps(report))
"""


def test_import_time_switches_are_read_and_checked_at_import():
    cases = [("GEARSHIFT_SAMPLER", "Torch", "gearshift.runner.sampler", "_TORCH_ONLY"),
             ("GEARSHIFT_SAMPLER", "auto", "gearshift.runner.sampler", "_TORCH_ONLY"),
             ("GEARSHIFT_SAMPLER", "fast", "gearshift.runner.sampler", "_TORCH_ONLY"),
             ("GEARSHIFT_PDL", "off", "gearshift.kernels.pdl", "_MODE"),
             ("GEARSHIFT_PDL", "sometimes", "gearshift.kernels.pdl", "_MODE")]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GEARSHIFT_")}
    proc = subprocess.run([sys.executable, "-c", _IMPORTS, json.dumps(cases)], env=clean,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["GEARSHIFT_SAMPLER=Torch"] == "True"
    assert report["GEARSHIFT_SAMPLER=auto"] == "False"
    assert report["GEARSHIFT_PDL=off"] == "'off'"
    for bad in ("GEARSHIFT_SAMPLER=fast", "GEARSHIFT_PDL=sometimes"):
        assert report[bad].startswith("ValueError") and bad.split("=")[0] in report[bad]
