"""The package build's one extra step: bundle the web page of ``attnmt export web``.

Everything else about the package is in pyproject.toml. Before setuptools collects the package's
files (``build_py``, which both ``pip install -e .`` and ``pip wheel .`` run), this runs ``npm ci
&& npm run build`` in src/attnmt/web where the bundle is missing or older than its sources and npm
is on PATH (attnmt/interop/web_bundle.py, loaded from its path: attnmt's dependencies are not
installed yet). Without npm the package still builds, without the page; the build says so once,
and ``attnmt export web`` names what to install. pip shows a build's own output only with ``-v``,
so the message goes to the terminal (/dev/tty) where there is one, else to stderr.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("attnmt_web_bundle", ROOT / "src" / "attnmt" / "interop" /
                                               "web_bundle.py")
web_bundle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(web_bundle)


def say(message: str) -> None:
    """One line for the person installing: on their terminal, past pip's capture of the build's output."""
    try:
        with open("/dev/tty", "w") as tty:
            print(message, file=tty)
    except OSError:  # no terminal (CI, Windows): stderr, which pip shows with -v
        print(message, file=sys.stderr)


class BuildPyWithWebPage(build_py):
    """``build_py`` that first builds the web page into src/attnmt/web/dist (package data)."""

    def run(self):
        web_bundle.build(ROOT / "src" / "attnmt" / "web", say=say)
        self.__dict__.pop("data_files", None)  # list dist/ as it is now, not as it was before the build
        super().run()


setup(cmdclass={"build_py": BuildPyWithWebPage})
