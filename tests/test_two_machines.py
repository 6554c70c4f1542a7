"""Two machines for real: two network namespaces joined by a veth pair, each with its own address
and its own disk, one torchrun agent in each (``--max-restarts 2``, ``--auto-resume``).

- The two-node run equals the one-process run of the same global batch, rank 0's machine holds
  the run and the other machine only its private copy of the prepared data.
- A killed worker on node 1 (SIGKILL) is survived: torchrun restarts the workers on both
  machines, the run continues from rank 0's last checkpoint (node 1 gets the state over the
  network, as its disk has none) and ends bit for bit as the uninterrupted two-node run.
- A cut link ends every worker within ``train.dist_timeout`` with one line naming the silent
  peer, rank 0's last checkpoint intact; ``--resume`` then goes on. (Node 0's torchrun agent
  gives up its restart after the rendezvous' ``join_timeout``; node 1's, cut off from the
  rendezvous host, waits on in torchrun's store client: a scheduler ends it.)

Each machine's disk is a folder that the other machine's processes cannot see (an empty tmpfs
mounted over it in their own mount namespace); HOME and TMPDIR are on it. The namespaces share
one host name, so each agent is given ``--local-addr`` and node 0 ``--rdzv-conf is_host=true``.
Needs root (``ip netns``, ``unshare``, ``mount``); skipped with one line where namespaces cannot
be made. Everything is removed afterwards, on failure too.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml

from attnmt.config import config_from_dict
from attnmt.train.loop import train

from .conftest import checkpoint_differences
from .test_distributed import _max_difference, _raw_config

ADDRESSES = ("10.213.0.1", "10.213.0.2")
PORT = 29400  # the rendezvous port on node 0 (a fresh namespace has every port free)
RUN_TIMEOUT = 300  # seconds for a two-machine run (two Python start-ups per machine, 2 cores)
DIST_TIMEOUT = 10  # train.dist_timeout of the cut-link case, in seconds
AGENT_TIMEOUT = 15  # the agents' rendezvous timeouts in that case (--rdzv-conf join_timeout, read_timeout)
STEPS = 12  # updates of the compared runs; a checkpoint every 3
RUN_FILES = ("config.yaml", "model.safetensors", "checkpoints/last.pt", "train_log.jsonl")
_names = itertools.count()


@dataclass
class Node:
    index: int
    namespace: str
    link: str  # its end of the veth pair
    address: str
    disk: Path  # this machine's own folder: out/ (its --output), home/, tmp/


@dataclass
class Network:
    nodes: list[Node]
    logs: Path  # the agents' output, on neither disk
    agents: list[subprocess.Popen] = field(default_factory=list)

    def launch(self, config: Path, *extra: str, rdzv: str = "join_timeout=60") -> list[subprocess.Popen]:
        """One torchrun agent per machine, each with the same command line but its own --output,
        HOME, TMPDIR and link; ``rdzv`` its ``--rdzv-conf`` (node 0 adds ``is_host=true``);
        returns them (node 0 first)."""
        started = []
        for node in self.nodes:
            hidden = self.nodes[1 - node.index].disk
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                        "--max-restarts", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                        f"{ADDRESSES[0]}:{PORT}", "--rdzv-id", "attnmt-test", "--local-addr", node.address,
                        "--rdzv-conf", rdzv + (",is_host=true" if node.index == 0 else ""),
                        "-m", "attnmt", "train", str(config), "--output", str(node.disk / "out"), "--auto-resume",
                        *extra]
            cmd = ["ip", "netns", "exec", node.namespace, "unshare", "--mount", "--propagation", "private",
                   "sh", "-c", 'mount -t tmpfs attnmt-other-disk "$0" && exec "$@"', str(hidden), *torchrun]
            env = dict(os.environ, HOME=str(node.disk / "home"), TMPDIR=str(node.disk / "tmp"),
                       GLOO_SOCKET_IFNAME=node.link, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                       PYTHONPATH=os.pathsep.join(sys.path))
            with open(self.logs / f"node{node.index}.{len(self.agents)}.log", "w") as log:
                proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            proc.log = log.name  # type: ignore[attr-defined]
            started.append(proc)
            self.agents.append(proc)
        return started

    def cut(self) -> None:
        """Take the link down on both sides."""
        for node in self.nodes:
            _ip("-n", node.namespace, "link", "set", node.link, "down")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def network(tmp_path):
    """Two namespaces with unique names joined by a veth pair (10.213.0.1/24, 10.213.0.2/24),
    and a disk folder for each; all removed afterwards, the agents' processes ended first."""
    tag = f"am{os.getpid()}x{next(_names)}"  # interface names have at most 15 characters
    namespaces, links = [f"attnmt-{tag}-{i}" for i in (0, 1)], [f"{tag}a", f"{tag}b"]
    made: list[str] = []
    try:
        if shutil.which("ip") is None or shutil.which("unshare") is None:
            pytest.skip("two-machine test: needs the ip and unshare commands (iproute2, util-linux)")
        try:
            for ns in namespaces:
                _ip("netns", "add", ns)
                made.append(ns)
            _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        except (OSError, subprocess.CalledProcessError) as e:
            pytest.skip(f"two-machine test: network namespaces cannot be made here "
                        f"({(getattr(e, 'stderr', '') or str(e)).strip()})")
        nodes = []
        for i, (ns, link, address) in enumerate(zip(namespaces, links, ADDRESSES)):
            _ip("link", "set", link, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", ns, "link", "set", link, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            disk = tmp_path / f"node{i}"
            for sub in ("home", "tmp"):
                (disk / sub).mkdir(parents=True)
            nodes.append(Node(i, ns, link, address, disk))
        (tmp_path / "logs").mkdir()
        net = Network(nodes, tmp_path / "logs")
        yield net
    finally:
        # torchrun starts each worker in a session of its own: ending the agent's session alone
        # would leave a worker running (and its namespace and link alive, out of `ip netns list`)
        agents = locals().get("net", Network([], tmp_path)).agents
        workers = [w for proc in agents if proc.poll() is None for w in _descendants(proc.pid)]
        for proc in agents:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # its end of the pair goes with it
        subprocess.run(["ip", "link", "del", links[0]], capture_output=True)  # where it never moved


def _finish(agents: list[subprocess.Popen]) -> None:
    for proc in agents:
        try:
            proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{proc.log}: no end after {RUN_TIMEOUT} s; {_tails(agents)}")
    for proc in agents:
        assert proc.returncode == 0, _tails(agents)


def _tails(agents: list[subprocess.Popen]) -> str:
    """The ends of the agents' logs (torchrun's and the workers' lines; c10d's warnings aside)."""
    tails = []
    for proc in agents:
        lines = [line for line in Path(proc.log).read_text().splitlines()
                 if line.strip() and not line.startswith(("[W", "frame #", "Exception raised", "<omitting"))]
        tails.append(f"{proc.log}:\n" + "\n".join(lines[-25:]))
    return "\n".join(tails)


def _workers(agent: int) -> list[int]:
    """The training processes torchrun's agent ``agent`` started (those whose environment has RANK)."""
    try:
        children = [int(c) for c in Path(f"/proc/{agent}/task/{agent}/children").read_text().split()]
        return [c for c in children if b"\0RANK=" in b"\0" + Path(f"/proc/{c}/environ").read_bytes()]
    except OSError:
        return []


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (its children, theirs, ...)."""
    try:
        children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                    for c in (task / "children").read_text().split()]
    except OSError:
        return []
    return children + [d for c in children for d in _descendants(c)]


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _wait_for(what, agents: list[subprocess.Popen], seconds: float = RUN_TIMEOUT):
    deadline = time.monotonic() + seconds
    while not (found := what()):
        for proc in agents:
            assert proc.poll() is None, Path(proc.log).read_text()[-3000:]
        assert time.monotonic() < deadline, "; ".join(Path(p.log).read_text()[-1500:] for p in agents)
        time.sleep(0.1)
    return found


def _checkpointed_step(run_dir: Path) -> int:
    """The step of the latest validation record in the run's log (0 before the first)."""
    log = run_dir / "train_log.jsonl"
    if not log.is_file():
        return 0
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return max((r["step"] for r in records if r["kind"] == "valid"), default=0)


def _write_config(directory: Path, max_steps: int) -> tuple[Path, dict]:
    raw = _raw_config(directory, 2, max_steps)
    raw["train"].update(accum_steps=1, valid_every=3, valid_bleu=False)
    config = directory / f"steps{max_steps}.yaml"
    config.write_text(yaml.safe_dump(raw))
    return config, raw


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def _attnmt_files(disk: Path) -> list[str]:
    """The files on a machine's disk outside its --output that attnmt could have written: all
    but those in torch's own folders under TMPDIR."""
    return sorted(f for f in _files(disk) if not f.startswith(("out/", "tmp/torchelastic_", "tmp/torchinductor_")))


def test_two_machines_train_as_one_process_and_survive_a_killed_worker(network, tmp_path):
    shared = tmp_path / "shared"  # the corpus and configuration: on both machines, as on a shared file system
    shared.mkdir()
    config, raw = _write_config(shared, STEPS)
    node0, node1 = network.nodes
    bounded = ("--set", "train.dist_timeout=60")  # a round stuck on a lost peer ends, rather than the test
    _finish(network.launch(config, *bounded))
    run = node0.disk / "out"
    reference = tmp_path / "one_process"  # 1 process x accumulation 2 == 2 machines x 1
    train(config_from_dict(dict(raw, train={**raw["train"], "accum_steps": 2})), reference, progress=False)
    assert _max_difference(run, reference) < 1e-5
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["world_size"] == 2
    # each disk holds what it should: rank 0's machine the run, the other only its copy of the data
    assert set(RUN_FILES) <= _files(run)
    assert not (node1.disk / "out").exists()
    copies = _attnmt_files(node1.disk)  # torch's own folders (torchelastic_*, torchinductor_*) aside
    assert len({f.split("/")[1] for f in copies}) == 1, copies  # one copy of the data
    assert all(f.startswith("tmp/attnmt-rank1-") and "/data/" in f for f in copies), copies
    assert not {Path(f).name for f in _files(node1.disk)} & {Path(f).name for f in RUN_FILES}
    assert not _attnmt_files(node0.disk)  # all of rank 0's is in its --output
    copy = node1.disk / "tmp" / copies[0].split("/")[1]
    uninterrupted = tmp_path / "uninterrupted"
    shutil.move(run, uninterrupted)
    shutil.rmtree(copy)

    # The same run again, node 1's worker killed after rank 0's first checkpoint.
    agents = network.launch(config, *bounded)
    step = _wait_for(lambda: _checkpointed_step(run), agents)
    victim = _wait_for(lambda: _workers(agents[1].pid), agents)[0]
    os.kill(victim, signal.SIGKILL)
    _finish(agents)
    logs = [Path(p.log).read_text() for p in agents]
    resumed = [line for line in logs[0].splitlines() if "resuming from step" in line]
    assert len(resumed) == 1 and step <= int(resumed[0].split("resuming from step ")[1].split()[0]) < STEPS, \
        logs[0][-3000:]
    assert checkpoint_differences(run / "checkpoints" / "last.pt", uninterrupted / "checkpoints" / "last.pt") == []
    assert not (node1.disk / "out").exists()
    assert len({f.split("/")[1] for f in _attnmt_files(node1.disk)}) == 1  # the restart found its copy


def test_a_cut_link_ends_every_worker_within_the_timeout(network, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    config, raw = _write_config(shared, 100_000)
    node0, node1 = network.nodes
    run = node0.disk / "out"
    agents = network.launch(config, "--set", f"train.dist_timeout={DIST_TIMEOUT}",
                            rdzv=f"join_timeout={AGENT_TIMEOUT},read_timeout={AGENT_TIMEOUT}")
    _wait_for(lambda: _checkpointed_step(run) >= 3, agents)
    workers = [w for proc in agents for w in _workers(proc.pid)]
    assert len(workers) == 2
    network.cut()
    cut_at = time.monotonic()
    while any(_alive(w) for w in workers) and time.monotonic() - cut_at < DIST_TIMEOUT + 60:
        time.sleep(0.1)
    ended = time.monotonic() - cut_at
    assert ended < DIST_TIMEOUT + 30, ended  # the timeout, the last update and the exit (on a busy machine)
    # Node 0's agent tries a restart, finds no rendezvous within join_timeout and ends; node 1's,
    # cut off from the rendezvous host, waits in torchrun's store client (the fixture ends it).
    try:
        agents[0].wait(timeout=AGENT_TIMEOUT + 60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"node 0's agent did not end: {Path(agents[0].log).read_text()[-3000:]}")
    assert agents[0].returncode != 0
    logs = [Path(p.log).read_text() for p in agents]
    for rank, (log, peer) in enumerate(zip(logs, (1, 0))):
        lines = [line for line in log.splitlines() if line.startswith("attnmt: error:")]
        assert len(lines) == 1, log[-3000:]
        # a failure of the machine or the network: the "environment:" line of exit status 1 (attnmt.cli)
        assert lines[0].startswith(f"attnmt: error: environment: rank {rank}: no answer from rank {peer} "
                                   f"at {ADDRESSES[peer]} within train.dist_timeout ({DIST_TIMEOUT} s)"), lines[0]
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)  # intact
    step = state["progress"]["step"]
    assert step >= 3 and state["world_size"] == 2
    result = train(config_from_dict(dict(raw, train={**raw["train"], "max_steps": step + 2})), run, resume=True,
                   progress=False)
    assert result.steps == step + 2
    assert not (node1.disk / "out").exists()
