"""A real single-node Slurm cluster (munged, slurmctld, slurmd) for tests, run as root.

Usage:

    with SlurmCluster(workdir, cpus=2) as cluster:
        result = cluster.sbatch_wait(["-n", "2", "--wrap", "srun --mpi=pmix hostname"])
        assert result.returncode == 0, cluster.slurmd_log()

Everything the daemons write (config, state, spool, pid files, logs, the munge socket) lives
under ``workdir``, and the daemons are stopped by PID on exit whatever happened. Nothing here
depends on a clean machine: the munge socket and the Slurm ports are private to each cluster,
so daemons left over from a crashed earlier run (or system ones) never block a new cluster.
The recipe follows /work/shared/ENVIRONMENT.md ("A real Slurm cluster on one machine").

Several nodes: given ``nodes`` (a running tests/harness/nodes.py ``Nodes``), slurmctld listens on the
bridge's address and one slurmd runs inside each node's namespaces, under the node's name:

    with Nodes(2) as nodes, SlurmCluster(workdir, cpus=2, nodes=nodes) as cluster:
        cluster.sbatch_wait(["--nodes=2", "--ntasks-per-node=1", "--wrap", "srun hostname"])
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

_BINARIES = ("munged", "munge", "unmunge", "setpriv", "slurmctld", "slurmd", "sinfo", "squeue",
             "sbatch", "scancel", "srun", "scontrol")
# Job states of a job that has not ended (scontrol's JobState).
_LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING",
                "REQUEUED", "STAGE_OUT", "SIGNALING"}
_USERS = ("munge", "slurm")
# A unix socket path is limited to 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107


def slurm_available() -> bool:
    """True when the Slurm and munge binaries and users exist and we are root."""
    if os.geteuid() != 0 or any(shutil.which(b) is None for b in _BINARIES):
        return False
    try:
        for user in _USERS:
            pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def _ephemeral_low() -> int:
    """The lowest port of the kernel's range for ports it picks itself (connections' local ends)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port() -> int:
    """A port free here and below the ephemeral range. The namespaced nodes' slurmds bind it in
    their own network namespaces, where this process cannot look: an ephemeral port was once
    taken there by a connection of an earlier multi-node job ("Unable to bind listen port
    (43689): Address already in use"). Ports outside that range are only ever bound on purpose."""
    hi = _ephemeral_low()
    lo = max(1024, hi - 12000)
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(lo, hi)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port found in {lo}-{hi - 1}")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path}: not written)"
    return "\n".join(text[-lines:]) or f"({path}: empty)"


def _unreachable_ancestor(path: Path) -> Path | None:
    """The first folder above ``path`` that other users cannot traverse, if any."""
    for folder in reversed(path.resolve().parents):
        if not folder.stat().st_mode & stat.S_IXOTH:
            return folder
    return None


class SlurmCluster:
    """Context manager running munged, slurmctld and slurmd for one node with ``cpus`` CPUs.

    Args:
        workdir: an empty or new folder that the munge and slurm users can reach (every
            ancestor must be world-traversable, so not pytest's 0700 ``tmp_path``).
        cpus: CPUs the node advertises; more than the machine has is allowed (slurmd is told
            to trust the configuration), which lets jobs run more ranks than cores.
    """

    def __init__(self, workdir: Path, cpus: int = 2, nodes=None):
        self.workdir = Path(workdir).resolve()
        self.cpus = cpus
        self.nodes = nodes
        self.host = socket.gethostname().split(".")[0]
        # (node name, address) of every slurmd; the controller's address as nodes reach it.
        if nodes is None:
            self.node_addrs = [(self.host, "127.0.0.1")]
            self.ctld_addr = "127.0.0.1"
        else:
            self.node_addrs = list(zip(nodes.names, nodes.addrs))
            self.ctld_addr = nodes.head_addr
        self.conf = self.workdir / "etc" / "slurm.conf"
        self.munge_socket = self.workdir / "munge" / "munge.socket.2"
        self._log_dir = self.workdir / "log"
        self._procs: dict[str, subprocess.Popen] = {}

    # --- bring-up ------------------------------------------------------------------------------

    def __enter__(self) -> "SlurmCluster":
        if not slurm_available():
            raise RuntimeError("Slurm/munge are not installed or we are not root: "
                               "run `bash launch/setup.sh --slurm` as root")
        blocked = _unreachable_ancestor(self.workdir)
        if blocked is not None:
            raise ValueError(f"{blocked} is not traversable by other users, so munged and "
                             f"slurmctld (which drop root) cannot reach {self.workdir}; "
                             "use a folder such as tempfile.mkdtemp() under /tmp")
        if len(str(self.munge_socket)) > _MAX_SOCKET_PATH:
            raise ValueError(f"workdir path too long for a unix socket: {self.munge_socket}")
        try:
            self._make_dirs()
            self._start_munged()
            self._write_conf()
            env = self.env()
            self._spawn("slurmctld", ["slurmctld", "-D"], env)
            if self.nodes is None:
                self._spawn("slurmd", ["slurmd", "-D"], env)
            else:  # one slurmd per node, inside the node's namespaces, under its name
                for i, (name, _) in enumerate(self.node_addrs):
                    # Slurm's PMIx keeps per-step folders in TmpFS under names without the
                    # node's: each node gets its own folder mounted at the common TmpFS path.
                    private = self.workdir / "nodetmp" / name
                    private.mkdir(parents=True, exist_ok=True)
                    private.chmod(0o1777)
                    argv = ["unshare", "--mount", "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"',
                            "sh", str(private), str(self.workdir / "tmp"), "slurmd", "-D", "-N", name]
                    self._spawn(f"slurmd-{i}", self.nodes.on(i, argv, host_sys=True), env)
            self._wait_idle(timeout=60)
        except BaseException:
            self._stop()
            raise
        return self

    def _make_dirs(self) -> None:
        slurm = pwd.getpwnam("slurm")
        munge = pwd.getpwnam("munge")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o755)
        for name, owner in (("etc", None), ("spool", None), ("jobs", None), ("tmp", None),
                            ("state", slurm), ("log", slurm), ("run", slurm), ("munge", munge)):
            folder = self.workdir / name
            folder.mkdir(exist_ok=True)
            # munged refuses a socket folder that group or others may write to.
            folder.chmod(0o755)
            if owner is not None:
                os.chown(folder, owner.pw_uid, owner.pw_gid)

    def _start_munged(self) -> None:
        munge = pwd.getpwnam("munge")
        # Every path munged touches, its key included, is private to this cluster and goes
        # with its folder: the machine's /etc/munge is neither read nor created, and a munged
        # still bound to /run/munge (a crashed earlier run, or the system's) neither blocks
        # nor serves us.
        run = self.workdir / "munge"
        key = run / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        os.chown(key, munge.pw_uid, munge.pw_gid)
        key.chmod(0o400)
        self._spawn("munged", [
            "setpriv", "--reuid=munge", "--regid=munge", "--init-groups",
            "munged", "--foreground", f"--socket={self.munge_socket}",
            f"--key-file={key}", f"--pid-file={run / 'munged.pid'}",
            f"--seed-file={run / 'munged.seed'}",
        ], os.environ.copy())
        deadline = time.monotonic() + 20
        while True:
            probe = subprocess.run(
                f"munge -n -S '{self.munge_socket}' | unmunge -S '{self.munge_socket}'",
                shell=True, capture_output=True, text=True)
            if probe.returncode == 0:
                return
            if self._procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("munged did not come up:\n" + probe.stderr
                                   + self._tails("munged"))
            time.sleep(0.1)

    def _write_conf(self) -> None:
        w = self.workdir
        nodes = "".join(f"NodeName={name} NodeAddr={addr} CPUs={self.cpus} RealMemory=2000 "
                        "State=UNKNOWN\n" for name, addr in self.node_addrs)
        self.conf.write_text(f"""\
# Written by tests/harness/slurm_cluster.py for one test cluster; every path is inside {w}.
ClusterName=hvdtest
SlurmctldHost={self.host}({self.ctld_addr})
SlurmUser=slurm
# Free ports picked at start-up, so a leftover daemon on 6817/6818 cannot interfere.
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
# Cores only: with memory as a resource each job would claim the whole node by default.
SelectTypeParameters=CR_Core
# Report the configured CPUs instead of probing, so cpus may exceed the machine's cores.
SlurmdParameters=config_overrides
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
StateSaveLocation={w}/state
# %n: the node's name, so slurmds sharing this filesystem keep their files apart.
SlurmdSpoolDir={w}/spool/%n
SlurmctldPidFile={w}/run/slurmctld.pid
SlurmdPidFile={w}/run/slurmd-%n.pid
SlurmctldLogFile={w}/log/slurmctld.log
SlurmdLogFile={w}/log/slurmd-%n.log
PlugStackConfig={w}/etc/plugstack.conf
TmpFS={w}/tmp
SlurmctldDebug=info
SlurmdDebug=info
InactiveLimit=0
KillWait=5
# A finished job's record lives at least this long (and up to the purge interval, a minute):
# sbatch_wait polls every 0.1 s, so it never misses the end.
MinJobAge=4
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        # An empty plug-in stack keeps /etc/slurm's site SPANK plug-ins out of the test jobs.
        (w / "etc" / "plugstack.conf").write_text("")
        for name, _ in self.node_addrs:
            (w / "spool" / name).mkdir(parents=True, exist_ok=True)

    def _spawn(self, name: str, argv: list[str], env: dict) -> None:
        with open(self._log_dir / f"{name}.out", "ab") as out:
            self._procs[name] = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                                 stdout=out, stderr=subprocess.STDOUT)

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}" + self._tails())
            probe = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env(),
                                   capture_output=True, text=True)
            state = probe.stdout.strip()
            states = state.split()
            if len(states) == len(self.node_addrs) and set(states) == {"idle"}:
                return
            time.sleep(0.2)
        raise RuntimeError(f"nodes not idle after {timeout:.0f} s (sinfo: {state!r})"
                           + self._tails())

    # --- tear-down -----------------------------------------------------------------------------

    def __exit__(self, *exc) -> None:
        try:
            self._stop()
        except Exception:  # noqa: BLE001 - tear-down must never mask the test's own outcome
            pass

    def _stop(self) -> None:
        try:
            self._cancel_jobs()
        except (OSError, subprocess.SubprocessError):
            pass  # the daemons are stopped below all the same
        daemons = [n for n in self._procs if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in daemons:
            proc = self._procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _cancel_jobs(self) -> None:
        # slurmstepd outlives slurmd, so running jobs are cancelled while the cluster still works.
        if not (self._alive("slurmctld") and all(
                self._alive(n) for n in self._procs if n.startswith("slurmd"))):
            return
        me = pwd.getpwuid(os.geteuid()).pw_name
        subprocess.run(["scancel", "--quiet", "--user", me], env=self.env(),
                       capture_output=True, timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env(),
                                  capture_output=True, text=True, timeout=10)
            if jobs.returncode != 0 or not jobs.stdout.strip():
                return
            time.sleep(0.2)

    def _alive(self, name: str) -> bool:
        proc = self._procs.get(name)
        return proc is not None and proc.poll() is None

    # --- use -----------------------------------------------------------------------------------

    def env(self) -> dict:
        """os.environ plus SLURM_CONF and what OpenMPI needs to run as root."""
        # Inherited job variables would describe some other allocation (e.g. an outer sbatch).
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        return env

    def sbatch_wait(self, args: list[str], timeout: float = 300,
                    cwd: Path | None = None) -> subprocess.CompletedProcess:
        """Submit with ``sbatch --parsable *args`` and wait for the job to end.

        The wait polls ``scontrol show job`` every 0.1 s: ``sbatch --wait`` polls every 2 s,
        which doubled the time of the short jobs the tests run.

        Args:
            args: sbatch options and the script (or ``--wrap CMD``).
            timeout: seconds to wait; then the job is cancelled and TimeoutError raised.
            cwd: where sbatch runs, hence the job's working folder and default output
                folder; defaults to ``workdir/jobs`` so slurm-%j.out stays out of the repo.

        Returns:
            The finished job: returncode is its exit code (128 + the signal if a signal ended
            it, as a shell reports), stdout starts with the job id.
        """
        cwd = Path(cwd) if cwd is not None else self.workdir / "jobs"
        argv = ["sbatch", "--parsable", *map(str, args)]
        sub = subprocess.run(argv, cwd=cwd, env=self.env(), capture_output=True, text=True,
                             timeout=60)
        if sub.returncode != 0:
            return sub
        job_id = sub.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout
        while True:
            show = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=self.env(),
                                  capture_output=True, text=True)
            # One line a job, or a job array's element (all must have ended).
            jobs = [dict(f.split("=", 1) for f in line.split() if "=" in f)
                    for line in show.stdout.splitlines() if line.strip()]
            states = [j.get("JobState", "") for j in jobs]
            if jobs and all(st and st not in _LIVE_STATES for st in states):
                rcs = []
                for j, st in zip(jobs, states):
                    code, sig = (int(x) for x in j.get("ExitCode", "0:0").split(":"))
                    rcs.append(code or (128 + sig if sig else 0) or (0 if st == "COMPLETED" else 1))
                rc = next((r for r in rcs if r), 0)
                return subprocess.CompletedProcess(argv, rc, sub.stdout, sub.stderr + " ".join(states))
            if show.returncode != 0 and "Invalid job id" in show.stderr:
                raise RuntimeError(f"job {job_id} ({argv}) vanished before its end was seen")
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job_id], env=self.env(), capture_output=True)
                queue = subprocess.run(["squeue", "-h", "-o", "%i %T %r"], env=self.env(),
                                       capture_output=True, text=True).stdout
                raise TimeoutError(f"job {job_id} ({argv}) still running after "
                                   f"{timeout:.0f} s; cancelled. squeue: {queue.strip()!r}")
            time.sleep(0.1)

    def slurmd_log(self) -> str:
        """Every slurmd's log (one per node), one after the other."""
        return "".join(self._read(p) for p in sorted(self._log_dir.glob("slurmd*.log")))

    def slurmctld_log(self) -> str:
        return self._read(self._log_dir / "slurmctld.log")

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""

    def _tails(self, *names: str) -> str:
        parts = []
        for name in names or ("munged", "slurmctld", *(n for n in self._procs if n.startswith("slurmd"))):
            # munged in the foreground logs to stderr, i.e. munged.out, never to its log file.
            paths = [] if name == "munged" else sorted(self._log_dir.glob(
                "slurmd*.log" if name.startswith("slurmd") else f"{name}.log"))
            for path in [*paths, self._log_dir / f"{name}.out"]:
                parts.append(f"\n--- {path} ---\n{_tail(path)}")
        return "".join(parts)
