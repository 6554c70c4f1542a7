"""The browser features are optional (README command 2 passes on a fresh clone without npm): every
test that needs the built web page, its JavaScript packages, node or chromium skips without them
through conftest's ``skip_without``, which names the package to install. Checked over the whole
suite: each test function or fixture that exports a web page, opens a browser or runs node is
guarded by ``skip_without`` (itself, or through a fixture or helper it uses), no test skips for
those tools on its own, and every benchmark run that exports a web page is in the smoke test's
NEEDS."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from tests import conftest
from tests.test_benchmarks_smoke import NEEDS, SUITES

TESTS = Path(__file__).resolve().parent
BENCHMARKS = TESTS.parent / "benchmarks"
# What needs the browser features: exporting a web page, a browser, node.
USES = re.compile(r'"export", "web"|export_web\(|sync_playwright|chromium\.launch|\["node",|\(\["node"')
# A skip of its own for one of those tools.
OWN_SKIP = re.compile(
    r"pytest\.skip\([^)]*(chromium|nodejs|\bnode\b(?! \w*\.)|web page|built page|JavaScript|npm is on)", re.I)


def _functions() -> dict[str, tuple[str, ast.FunctionDef, str]]:
    """Every top-level function of the test modules: name -> (module, node, source)."""
    out = {}
    for path in sorted(TESTS.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef):
                out.setdefault(node.name, (path.name, node, ast.get_source_segment(text, node)))
    return out


def _names_used(node: ast.FunctionDef) -> set[str]:
    """The fixtures a function asks for and the functions it calls (by name or attribute)."""
    used = {a.arg for a in node.args.args}
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        used.add(call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", ""))
    return used


def _closure(functions, seed: set[str]) -> set[str]:
    """``seed`` and every function that uses one of them (a fixture it asks for, a function it
    calls), transitively."""
    found = set(seed)
    while True:
        more = {name for name, (_, node, _) in functions.items() if name not in found and _names_used(node) & found}
        if not more:
            return found
        found |= more


def _is_test_or_fixture(node: ast.FunctionDef) -> bool:
    return node.name.startswith("test_") or any("fixture" in ast.unparse(d) for d in node.decorator_list)


# Tests that export a web page without needing the built one: they build a stand-in page in a
# temporary folder or stop at an error before the page is read (they pass without npm).
NEEDS_NO_PAGE = {"test_a_wheel_without_the_page_names_what_to_install",
                 "test_export_refuses_a_stale_bundle_in_one_line", "test_export_errors_are_one_line",
                 # an option the export cannot honour, refused before the page is read
                 "test_an_option_the_machine_or_model_cannot_honour_is_refused_before_work",
                 "test_every_capability_option_has_a_case"}


def test_every_test_needing_the_page_chromium_or_node_skips_through_skip_without():
    functions = _functions()
    users = _closure(functions, {name for name, (_, _, source) in functions.items() if USES.search(source)})
    checked = {name: functions[name][0] for name in users
               if _is_test_or_fixture(functions[name][1]) and name not in NEEDS_NO_PAGE}
    assert len(checked) > 10  # the check finds them: web export, serve page, multilingual, scores ...
    guarded = _closure(functions, {name for name, (_, _, source) in functions.items() if "skip_without(" in source})
    unguarded = sorted(f"{module}::{name}" for name, module in checked.items() if name not in guarded)
    assert not unguarded, "use conftest.skip_without in (or in a fixture of):\n" + "\n".join(unguarded)


def test_no_test_skips_for_the_browser_tools_on_its_own():
    own = [f"{path.name}:{text[:m.start()].count(chr(10)) + 1}" for path in sorted(TESTS.glob("test_*.py"))
           for text in [path.read_text(encoding="utf-8")] for m in OWN_SKIP.finditer(text)]
    assert not own, own


def test_every_benchmark_run_that_exports_a_web_page_needs_the_page():
    exporting = set()
    for path in sorted(BENCHMARKS.glob("suite_*.py")):
        text = path.read_text(encoding="utf-8")
        suite = path.stem.removeprefix("suite_")
        tree = ast.parse(text)
        parts = set(SUITES[suite].PARTS) if suite in SUITES else set()  # the registry's part names
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and USES.search(ast.get_source_segment(text, node)):
                exporting.add(f"{suite} --part {node.name}" if node.name in parts else suite)
    assert {"web", "quality --part distill"} <= exporting
    assert all("page" in NEEDS.get(run, ()) for run in exporting), (exporting, NEEDS)


@pytest.mark.parametrize("need, package", [("page", "nodejs npm"), ("packages", "npm"), ("node", "nodejs"),
                                           ("chromium", "chromium")])
def test_skip_without_names_the_package(need, package, monkeypatch, tmp_path):
    monkeypatch.setattr(conftest, "WEB", tmp_path)  # no dist/, no node_modules/
    monkeypatch.setattr(conftest.shutil, "which", lambda name: None)  # no node, no chromium on PATH
    monkeypatch.setattr(conftest.os.path, "exists", lambda path: path != "/usr/bin/chromium" and os.access(path, 0))
    with pytest.raises(pytest.skip.Exception, match=f"Debian package[s]? {package}"):
        conftest.skip_without(need)
    assert conftest.missing_web_tool() is None
