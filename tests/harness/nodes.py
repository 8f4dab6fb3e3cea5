"""Several cluster nodes on one machine: each a network + UTS namespace on a bridge (as root).

Every node is a Linux network namespace named like the node (``hvdn<pid>-<i>``) with one veth
link to a bridge in the root namespace and its own address (10.231.X.<i+1>/24); every command
run "on" a node also gets a UTS namespace whose hostname is the node's name. All nodes share
the filesystem, as a cluster's nodes share a home. `ip netns exec` bind-mounts
/etc/netns/<node>/hosts over /etc/hosts, so node names resolve on every node.

mpirun runs on node 0 (like a job's first node) with a hostfile of the node names; OpenMPI
starts its daemon on the other nodes through ``tests/harness/node_agent.sh`` (``plm_rsh_agent``), which
enters that node's namespaces instead of ssh-ing to it.

Usage:

    with Nodes(2) as nodes:
        p = nodes.mpirun(2, ["-m", "hvd_adaptive.cli", "train", ...])   # 2 ranks per node
        nodes.link_down(1)                                               # fault injection

    # the same from a shell: bring up 2 nodes, run CMD on node 0, tear down
    python tests/harness/nodes.py 2 -- mpirun --hostfile '$HVD_NODES_HOSTFILE' ... CMD

Everything created (processes inside the namespaces, namespaces, links, the bridge, the
/etc/netns entries, the temporary folder) is removed by name and PID on exit, and entries of
earlier runs whose owning process is gone are removed on entry, so a killed test run leaves
nothing behind for the next one.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "hvdn"  # every name made here starts with PREFIX + the owning process's PID
AGENT = Path(__file__).resolve().parent / "node_agent.sh"
_NETNS_ETC = Path("/etc/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_names() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    return [m.group(1) for m in re.finditer(r"^\d+: ([^:@\s]+)", out, re.M)]


def _owner(name: str) -> int | None:
    m = re.match(PREFIX + r"(\d+)", name)
    return int(m.group(1)) if m else None


def remove_all(tag: str) -> None:
    """Removes everything named ``tag*``: processes in its namespaces (by PID), namespaces,
    links, /etc/netns entries and temporary folders. Safe to call twice."""
    for ns in [n for n in _netns_names() if n.startswith(tag)]:
        for _ in range(20):  # processes can still be forking while we kill
            pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        _ip("netns", "delete", ns, check=False)
        shutil.rmtree(_NETNS_ETC / ns, ignore_errors=True)
    for link in [n for n in _link_names() if n.startswith(tag)]:
        _ip("link", "delete", link, check=False)
    for folder in Path(tempfile.gettempdir()).glob(f"{tag}-*"):
        shutil.rmtree(folder, ignore_errors=True)
    for folder in _NETNS_ETC.glob(f"{tag}*") if _NETNS_ETC.is_dir() else []:
        shutil.rmtree(folder, ignore_errors=True)


def remove_stale() -> None:
    """Removes what earlier runs left behind: names whose owning process no longer runs."""
    names = _netns_names() + _link_names() + [p.name for p in Path(tempfile.gettempdir()).glob(PREFIX + "*")]
    for pid in {_owner(n) for n in names} - {None}:
        if pid != os.getpid() and not _alive(pid):
            remove_all(f"{PREFIX}{pid}")


def available() -> bool:
    """Root and the tools the harness needs (iproute2, util-linux's unshare)."""
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("ip", "unshare", "mpirun"))


def _free_subnet() -> ipaddress.IPv4Network:
    used = _ip("-4", "route", "show", check=False).stdout + _ip("-4", "addr", "show", check=False).stdout
    for k in range(256):
        net = ipaddress.ip_network(f"10.231.{(os.getpid() + k) % 254}.0/24")
        if f"10.231.{(os.getpid() + k) % 254}." not in used:
            return net
    raise RuntimeError("no free 10.231.X.0/24 subnet for the test nodes")


class Nodes:
    """Context manager bringing up ``n`` namespaced nodes; see the module docstring."""

    def __init__(self, n: int = 2, slots: int = 2):
        self.n, self.slots = n, slots
        self.tag = f"{PREFIX}{os.getpid()}"
        self.names = [f"{self.tag}-{i}" for i in range(n)]
        self.bridge = f"{self.tag}b"
        self.host_links = [f"{self.tag}h{i}" for i in range(n)]
        self.net = None
        self.addrs: list[str] = []
        self.head_addr = ""   # the bridge's address: reachable from every node
        self.workdir: Path | None = None
        self.hostfile: Path | None = None

    def __enter__(self) -> "Nodes":
        if not available():
            raise RuntimeError("multi-node tests need root, iproute2 (ip), unshare and mpirun: "
                               "run `bash launch/setup.sh` as root")
        remove_stale()
        remove_all(self.tag)  # a leftover of this very PID (an earlier harness in this process)
        try:
            self._up()
        except BaseException:
            remove_all(self.tag)
            raise
        return self

    def __exit__(self, *exc) -> None:
        remove_all(self.tag)

    def _up(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.workdir.chmod(0o755)
        self.net = _free_subnet()
        hosts = list(self.net.hosts())
        self.addrs = [str(hosts[i]) for i in range(self.n)]
        self.head_addr = str(hosts[-1])
        prefix = self.net.prefixlen
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.head_addr}/{prefix}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        table = "127.0.0.1 localhost\n" + "".join(
            f"{a} {name}\n" for a, name in zip(self.addrs, self.names)) + f"{self.head_addr} {self.tag}-head\n"
        for i, name in enumerate(self.names):
            _ip("netns", "add", name)
            inside = f"{self.tag}n{i}"
            _ip("link", "add", self.host_links[i], "type", "veth", "peer", "name", inside)
            _ip("link", "set", self.host_links[i], "master", self.bridge)
            _ip("link", "set", self.host_links[i], "up")
            _ip("link", "set", inside, "netns", name)
            _ip("-n", name, "link", "set", inside, "name", "eth0")
            _ip("-n", name, "addr", "add", f"{self.addrs[i]}/{prefix}", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
            (_NETNS_ETC / name).mkdir(parents=True, exist_ok=True)
            (_NETNS_ETC / name / "hosts").write_text(table)
        self.hostfile = self.workdir / "hostfile"
        self.hostfile.write_text("".join(f"{name} slots={self.slots}\n" for name in self.names))
        # Every node reaches every other one (the bridge forwards between veths).
        for i, name in enumerate(self.names):
            peer = self.addrs[(i + 1) % self.n]
            ping = subprocess.run(["ip", "netns", "exec", name, "ping", "-c1", "-W2", peer],
                                  capture_output=True, text=True) if shutil.which("ping") else None
            if ping is not None and ping.returncode != 0:
                raise RuntimeError(f"node {name} cannot reach {peer}: {ping.stdout}{ping.stderr}")

    # --- running things on nodes ---------------------------------------------------------------

    def on(self, i: int, argv: list[str], host_sys: bool = False) -> list[str]:
        """argv run on node i: in its network namespace, with its hostname (argv as given,
        unlike the agent, whose command goes through a shell as over ssh).

        host_sys: enter the network namespace with nsenter instead of `ip netns exec`, which
        mounts a fresh /sys without /sys/fs/cgroup (slurmd needs that) and /etc/netns's hosts.
        """
        name = self.names[i]
        enter = (["nsenter", f"--net=/run/netns/{name}"] if host_sys else ["ip", "netns", "exec", name])
        return [*enter, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, *argv]

    def mpi_env(self, base: dict | None = None, **extra: str) -> dict:
        """``base`` (default os.environ) plus OpenMPI's launch agent for these nodes, the
        hostfile as $HVD_NODES_HOSTFILE and root permissions, then ``extra``."""
        env = dict(os.environ if base is None else base)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_plm_rsh_agent=str(AGENT), HVD_NODES_HOSTFILE=str(self.hostfile))
        env.update(extra)
        return env

    def mpirun_argv(self, per_node: int, args: list[str], mca: dict | None = None,
                    nodes: int | None = None) -> list[str]:
        """`mpirun` on node 0 over the first ``nodes`` nodes, ``per_node`` ranks on each."""
        nodes = nodes or self.n
        cmd = ["mpirun", "--hostfile", str(self.hostfile_of(nodes)), "-np", str(per_node * nodes),
               "--map-by", f"ppr:{per_node}:node", "--bind-to", "none", "--oversubscribe"]
        for k, v in (mca or {}).items():
            cmd += ["--mca", k, str(v)]
        return self.on(0, cmd + list(args))

    def hostfile_of(self, nodes: int) -> Path:
        """A hostfile of the first ``nodes`` nodes."""
        if nodes == self.n:
            return self.hostfile
        path = self.workdir / f"hostfile-{nodes}"
        path.write_text("".join(f"{m} slots={self.slots}\n" for m in self.names[:nodes]))
        return path

    def link_down(self, i: int) -> None:
        """Takes node i's only network link down (its cable pulled)."""
        _ip("link", "set", self.host_links[i], "down")

    def link_up(self, i: int) -> None:
        _ip("link", "set", self.host_links[i], "up")

    def pids(self, i: int) -> list[int]:
        """PIDs of every process on node i."""
        return [int(p) for p in _ip("netns", "pids", self.names[i], check=False).stdout.split()]


def _main(argv: list[str]) -> int:
    """python tests/harness/nodes.py N [--slots S] -- CMD...: CMD runs on node 0, then all is removed."""
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    opts, cmd = argv[:cut], argv[cut + 1:]
    n = int(opts[0]) if opts else 2
    slots = int(opts[opts.index("--slots") + 1]) if "--slots" in opts else 2
    with Nodes(n, slots=slots) as nodes:
        print(f"[nodes] {n} nodes: " + ", ".join(f"{m} ({a})" for m, a in zip(nodes.names, nodes.addrs))
              + f"; hostfile {nodes.hostfile}", flush=True)
        # $VARS in CMD expand on node 0 (e.g. '$HVD_NODES_HOSTFILE'), so the shell runs it.
        return subprocess.run(nodes.on(0, ["bash", "-c", " ".join(cmd)]), env=nodes.mpi_env()).returncode


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
