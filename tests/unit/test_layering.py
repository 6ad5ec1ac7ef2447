"""The packages depend on each other one way only, and importing any core or middleware module
does nothing but define things: no network, no thread, no process.

Layers, from the bottom (a module imports only from its own layer or those below):

0. primitives: ``jobsystem.dramatiq_internals``, ``limits``, ``urls``, ``runtime``, ``store``,
   ``privacy`` (but ``privacy.setup``, which reads settings)
1. ``middleware``: Dramatiq middleware, configured by constructor arguments
2. the core that reads settings and wires things: ``jobsystem.settings``, ``startup``,
   ``privacy.setup``, ``observability``, ``rabbitmq``, ``ops``, ``stack``, ``system``
3. entry points: ``actors``, ``jobctl``, ``scheduler``, ``demo``, ``bench``, ``dashboard``
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

ENTRY_POINTS = ("actors", "jobctl", "scheduler", "demo", "bench", "dashboard")
PRIMITIVES = ("dramatiq_internals", "limits", "urls", "runtime", "store", "privacy")
PROJECT = ("jobsystem", "middleware", *ENTRY_POINTS)


def layer(module: str) -> int:
    top, _, rest = module.partition(".")
    if top in ENTRY_POINTS:
        return 3
    if top == "middleware":
        return 1
    if rest == "privacy.setup":
        return 2
    return 0 if rest.split(".")[0] in (*PRIMITIVES, "") else 2


@functools.cache  # the checkout does not change during a run; several tests read it
def modules() -> dict[str, Path]:
    found = {}
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@functools.cache  # parsing every module is the slow part, and three tests need the same parse
def import_nodes(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``path``, wherever in the file (functions included)."""
    return [
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]


def imports(path: Path, module: str) -> set[str]:
    """The project modules ``path`` imports, wherever in the file (functions included)."""
    found: set[str] = set()
    for node in import_nodes(path):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: resolved against the importing package
                base = ".".join([*module.split(".")[: -node.level], node.module])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    known = modules()
    return {name for name in found if name in known and name.split(".")[0] in PROJECT}


def test_every_import_points_down_the_layers():
    wrong = [
        f"{module} (layer {layer(module)}) imports {imported} (layer {layer(imported)})"
        for module, path in modules().items()
        for imported in imports(path, module)
        if layer(imported) > layer(module)
    ]
    assert wrong == []


def test_middleware_never_imports_the_wiring_or_the_entry_points():
    forbidden: tuple[str, ...] = (
        "jobsystem.settings",
        "jobsystem.system",
        "jobsystem.stack",
        "jobsystem.rabbitmq",
    )
    forbidden += ("jobsystem.ops", "jobsystem.observability", "jobsystem.privacy.setup", *ENTRY_POINTS)
    wrong = [
        f"{module} imports {imported}"
        for module, path in modules().items()
        if module.startswith("middleware")
        for imported in imports(path, module)
        if imported.startswith(forbidden)
    ]
    assert wrong == []


def test_no_module_reads_the_broker_store_or_settings_from_a_package():
    # They are handed the System (or call jobsystem.system.get_system), not package globals.
    wrong = []
    for module, path in [*modules().items(), *((p.stem, p) for p in (ROOT / "tests").rglob("*.py"))]:
        for node in import_nodes(path):
            if isinstance(node, ast.ImportFrom) and node.module in ("actors", "jobsystem"):
                names = {alias.name for alias in node.names} & {"broker", "store", "settings", "system"}
                if names - {"settings"} or (names and node.module == "actors"):
                    wrong.append(f"{module}: from {node.module} import {', '.join(sorted(names))}")
    assert wrong == []


def test_actors_package_only_builds_the_system_and_imports_the_actors():
    source = (ROOT / "actors" / "__init__.py").read_text()
    assert len(source.splitlines()) <= 20


_GUARDED_IMPORTS = """
import importlib, json, socket, subprocess, sys, threading

def refuse(what):
    def refused(*args, **kwargs):
        raise AssertionError(f"{what} at import time")
    return refused

socket.socket.connect = refuse("a network connection")
socket.socket.connect_ex = refuse("a network connection")
socket.create_connection = refuse("a network connection")
socket.getaddrinfo = refuse("a name lookup")
threading.Thread.start = refuse("a thread")
subprocess.Popen.__init__ = refuse("a process")
failures = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failures[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failures))
"""


def test_importing_any_core_or_middleware_module_touches_no_network_and_starts_nothing(tmp_path):
    names = sorted(m for m in modules() if m.split(".")[0] in ("jobsystem", "middleware"))
    assert "jobsystem.settings" in names and "jobsystem.system" in names
    result = subprocess.run(
        [sys.executable, "-c", _GUARDED_IMPORTS, json.dumps(names)],
        cwd=tmp_path,  # nothing of the checkout's var/ either
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {}
    assert list(tmp_path.iterdir()) == []  # and writes no file


@pytest.mark.parametrize("package", ["jobsystem", "middleware", "tests"])
def test_every_module_is_one_concept_of_modest_size(package):
    # The tests too: a test module past 400 lines holds more than one concept (split it by what
    # its tests are about, shared helpers in a module of their own).
    too_long = {
        str(path.relative_to(ROOT)): n
        for path in (ROOT / package).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 400
    }
    assert too_long == {}
