"""The web page's bundle: which files it is built from, whether ``dist/`` is current, and the build.

``attnmt export web`` copies a bundle (``attnmt/web/dist``) that npm and esbuild build from the
JavaScript sources in ``attnmt/web``. ``npm run build`` (``build.mjs``) records the SHA-256 of each
source in ``dist/SOURCES.sha256``, in ``sha256sum``'s format (``<hex>  <path>`` per line, paths
relative to ``attnmt/web``, sorted), so ``cd src/attnmt/web && sha256sum -c dist/SOURCES.sha256``
checks it by hand too. The sources are :data:`SOURCE_FILES` and every file under ``src/``: what
esbuild reads and what ``build.mjs`` copies (the tests and tools are not part of the page).

This module is loaded by ``setup.py`` from its path, before attnmt's dependencies are installed,
so it imports only the standard library. Nothing in the Python packaging ecosystem builds an npm
project inside a setuptools build without a plugin of its own (Jupyter's hatch-jupyter-builder is
Hatch-only), so the step is written here: a few lines around ``npm ci && npm run build``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

SOURCE_FILES = ("build.mjs", "index.html", "package.json", "package-lock.json")
ASSET_FILES = ("index.html", "attnmt.js", "attnmt.js.LEGAL.txt", "ort-wasm-simd-threaded.mjs",
               "ort-wasm-simd-threaded.wasm")  # what ``build.mjs`` writes into dist/ and the export copies
SOURCES_RECORD = "SOURCES.sha256"
BUILD_PACKAGES = "Node.js 20+ and npm (Debian/Ubuntu: apt install nodejs npm)"


def source_hashes(web_dir: Path) -> dict[str, str]:
    """{path relative to ``web_dir`` (posix): SHA-256 hex} of the files the bundle is built from;
    empty where ``web_dir`` holds no sources (an installed wheel ships only ``dist/``)."""
    files = [web_dir / name for name in SOURCE_FILES if (web_dir / name).is_file()]
    if (web_dir / "src").is_dir():
        files += [p for p in (web_dir / "src").rglob("*") if p.is_file()]
    return {p.relative_to(web_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(files, key=lambda p: p.relative_to(web_dir).as_posix())}


def recorded_hashes(dist: Path) -> dict[str, str] | None:
    """The hashes ``build.mjs`` recorded in ``dist/SOURCES.sha256``; None where there is no record."""
    record = dist / SOURCES_RECORD
    if not record.is_file():
        return None
    pairs = (line.split("  ", 1) for line in record.read_text(encoding="utf-8").splitlines() if line.strip())
    return {path: digest for digest, path in pairs}


def changed_sources(web_dir: Path) -> list[str]:
    """The sources whose content differs from what ``dist/`` was built from (edited, added or
    removed since), sorted; every source where ``dist/`` records nothing; [] where ``web_dir``
    has no sources to compare (an installed wheel)."""
    current = source_hashes(web_dir)
    if not current:
        return []
    recorded = recorded_hashes(web_dir / "dist") or {}
    return sorted(p for p in current.keys() | recorded.keys() if current.get(p) != recorded.get(p))


def missing_assets(dist: Path) -> list[str]:
    """The :data:`ASSET_FILES` not in ``dist``."""
    return [name for name in ASSET_FILES if not (dist / name).is_file()]


def build(web_dir: Path, say) -> bool:
    """Build the bundle with ``npm ci && npm run build`` in ``web_dir`` where it is missing or
    older than its sources; ``say(message)`` reports what happened (one line).

    Returns:
        True where ``dist/`` is current afterwards. False, after saying why, where ``web_dir``
        has no package.json, npm is not on PATH (:data:`BUILD_PACKAGES`) or the build failed:
        the Python package installs without the page, and ``attnmt export web`` explains.
    """
    if not (web_dir / "package.json").is_file():
        return not missing_assets(web_dir / "dist")
    if not missing_assets(web_dir / "dist") and not changed_sources(web_dir):
        return True
    npm = shutil.which("npm")
    if npm is None:
        say(f"attnmt: the web page of 'attnmt export web' was not built: npm is not on PATH; install "
            f"{BUILD_PACKAGES} and reinstall attnmt to build it")
        return False
    say(f"attnmt: building the web page in {web_dir} (npm ci && npm run build)")
    for args in ([npm, "ci", "--no-audit", "--no-fund"], [npm, "run", "build"]):
        try:
            run = subprocess.run(args, cwd=web_dir, capture_output=True, text=True)
        except OSError as e:  # npm gone or not executable since shutil.which saw it
            say(f"attnmt: the web page was not built: {npm} cannot run ({e.strerror or e}) in {web_dir}")
            return False
        if run.returncode != 0:
            tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
            say(f"attnmt: the web page was not built: '{' '.join(args[1:])}' failed in {web_dir}: {tail[0]}")
            return False
    return not missing_assets(web_dir / "dist") and not changed_sources(web_dir)
