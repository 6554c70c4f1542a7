"""The Dockerfile (no container engine runs here): what can be checked without building it."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pip_installs(lines: list[str]) -> list[list[str]]:
    """The arguments of each `pip install` command, options such as -q dropped."""
    found = []
    for line in (x for x in lines if "pip install" in x):
        words = shlex.split(line)
        if "install" in words and any(w.endswith("pip") for w in words):
            args = words[words.index("install") + 1:]
            found.append([a for a in args if a not in ("-q", "--upgrade", "-e")])
    return found


def test_dockerfile_installs_what_ci_installs():
    docker = (REPO / "Dockerfile").read_text().splitlines()
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    in_docker = _pip_installs([line.removeprefix("RUN ") for line in docker if line.startswith("RUN ")])
    in_ci = _pip_installs(ci)
    torch_pin = [a for args in in_ci for a in args if a.startswith("torch")]
    assert torch_pin == ["torch==2.13.0"]
    # the same order: the pinned torch (CPU wheel), then the package with an extra (the image upgrades pip first;
    # CI runs README command 1's lines as written)
    assert [args[0] for args in in_docker] == ["pip", in_ci[0][0], ".[serve]"]
    assert in_ci[1] == [".[test]"]
    assert in_docker[1] == ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    test_extras = {name for dep in extras["test"] if dep.startswith("attnmt[")
                   for name in dep[len("attnmt["):-1].split(",")}
    assert "serve" in test_extras  # CI's install covers the image's


def test_dockerfile_runs_the_server_as_a_user_on_a_mounted_model():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.\d+-slim$", text, re.M)
    user = re.search(r"^USER (\S+)$", text, re.M)
    assert user and user.group(1) != "root" and f"useradd --create-home --uid 10001 {user.group(1)}" in text
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    assert entry[:2] == ["attnmt", "serve"] and entry[entry.index("--model") + 1] == "/model"
    assert json.loads(re.search(r"^VOLUME (\[.*\])$", text, re.M).group(1)) == ["/model"]
    assert text.index("USER") < text.index("ENTRYPOINT") and "--host\", \"0.0.0.0" in text
