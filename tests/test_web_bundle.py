"""The web page's bundle and the package build: the build step runs npm only where the bundle is
missing or older than its sources and npm is on PATH (a fake npm records its calls here), says
once what to install without it, and ``attnmt export web`` refuses a missing or stale bundle in one
line that names what to do, not a path inside site-packages."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from attnmt.cli import main
from attnmt.interop import web as web_export
from attnmt.interop import web_bundle
from tests.conftest import skip_without

REAL_WEB = Path(web_export.WEB_DIR)

# A stand-in for npm: records each call, and `npm run build` writes the assets and the record of the
# sources the way build.mjs does (sha256sum's format, sorted paths).
FAKE_NPM = """#!/bin/sh
echo "$*" >> "$NPM_CALLS"
if [ "$1" = "run" ]; then
    mkdir -p dist
    for f in {assets}; do echo built > "dist/$f"; done
    find build.mjs index.html package.json package-lock.json src -type f | LC_ALL=C sort | xargs sha256sum \
        > dist/SOURCES.sha256
fi
"""


def _sources(web: Path) -> Path:
    (web / "src").mkdir(parents=True)
    for name in web_bundle.SOURCE_FILES:
        (web / name).write_text(f"// {name}\n")
    (web / "src" / "search.js").write_text("export const beam = 5;\n")
    return web


@pytest.fixture
def fake_npm(tmp_path, monkeypatch):
    """PATH holding only a fake npm; returns the file its calls are written to."""
    if not shutil.which("sha256sum") or not shutil.which("sh"):
        pytest.skip("sha256sum and sh are needed by the fake npm (coreutils)")
    bin_dir, calls = tmp_path / "bin", tmp_path / "npm_calls"
    bin_dir.mkdir()
    npm = bin_dir / "npm"
    npm.write_text(FAKE_NPM.replace("{assets}", " ".join(web_bundle.ASSET_FILES)))
    npm.chmod(npm.stat().st_mode | stat.S_IEXEC)
    for tool in ("mkdir", "find", "sort", "xargs", "sha256sum", "sh"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("NPM_CALLS", str(calls))
    return calls


def test_build_runs_npm_only_when_the_bundle_is_missing_or_stale(tmp_path, fake_npm):
    web, said = _sources(tmp_path / "web"), []
    assert web_bundle.build(web, said.append)
    assert fake_npm.read_text().splitlines() == ["ci --no-audit --no-fund", "run build"]
    assert web_bundle.changed_sources(web) == [] and web_export.assets_dir(web) == web / "dist"
    assert web_bundle.build(web, said.append)  # current: npm is not called again
    assert len(fake_npm.read_text().splitlines()) == 2 and len(said) == 1
    (web / "src" / "search.js").write_text("export const beam = 4;\n")
    assert web_bundle.changed_sources(web) == ["src/search.js"]
    assert web_bundle.build(web, said.append)  # stale: rebuilt
    assert len(fake_npm.read_text().splitlines()) == 4 and web_bundle.changed_sources(web) == []


def test_build_without_npm_says_once_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    web, said = _sources(tmp_path / "web"), []
    assert not web_bundle.build(web, said.append)
    assert len(said) == 1 and "npm is not on PATH" in said[0] and "apt install nodejs npm" in said[0]
    assert not (web / "dist").exists()


def test_a_failing_npm_leaves_the_install_going(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text("#!/bin/sh\necho 'npm ERR! network unreachable' >&2\nexit 1\n")
    (bin_dir / "npm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/bin")
    said = []
    assert not web_bundle.build(_sources(tmp_path / "web"), said.append)
    assert "'ci --no-audit --no-fund' failed" in said[-1] and "network unreachable" in said[-1]


def test_export_refuses_a_stale_bundle_in_one_line(tmp_path, fake_npm, monkeypatch, capsys, tiny_run):
    web = _sources(tmp_path / "web")
    assert web_bundle.build(web, lambda m: None)
    (web / "src" / "search.js").write_text("export const beam = 4;  // edited, not rebuilt\n")
    monkeypatch.setattr(web_export, "WEB_DIR", web)
    out = tmp_path / "site"
    assert main(["export", "web", "--model", str(tiny_run), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnmt: error:") and err.count("\n") == 1
    assert "older than its sources (src/search.js changed" in err and "npm run build" in err
    assert not out.exists()


def test_a_wheel_without_the_page_names_what_to_install(tmp_path, monkeypatch, capsys, tiny_run):
    installed = tmp_path / "site-packages" / "attnmt" / "web"  # a wheel built without npm: no dist, no sources
    installed.mkdir(parents=True)
    monkeypatch.setattr(web_export, "WEB_DIR", installed)
    assert main(["export", "web", "--model", str(tiny_run), "--output", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no web page" in err and "apt install nodejs npm" in err
    assert "site-packages" not in err


def test_the_built_page_records_the_sources_it_was_built_from():
    """build.mjs's record (JavaScript) and web_bundle's hashes (Python) agree on this checkout's
    sources: the bundle that `pip install` built is current."""
    skip_without("page")
    recorded = web_bundle.recorded_hashes(REAL_WEB / "dist")
    assert recorded is not None and "src/search.js" in recorded and "package-lock.json" in recorded
    assert recorded == web_bundle.source_hashes(REAL_WEB), web_bundle.changed_sources(REAL_WEB)
