"""Test "hosts" on one machine: network namespaces on a private bridge, each with its own sshd.

    with NamespaceHosts(2) as hosts:
        hosts.ssh(hosts[1], "hostname")
        shape(hosts[1], rate="50mbit", delay="1ms")
        path = hosts.write_cluster_file(tmp / "cluster.yml", workers=[1, 2])

Each host is a namespace with one interface `eth0` at 10.231.<net>.<10+i>/24, joined by a bridge
in the calling namespace that holds 10.231.<net>.1, so the caller (and mpirun there) reaches every
host and the hosts reach each other. The subnet exists only on these links: no other address is
ever used, and there is no default route out of a namespace. Each host has its own UTS namespace
(its own hostname) so MPI and ps-lite see distinct machines. sshd runs with a throwaway host key
and accepts a throwaway client key; `ssh_config` makes `ssh -F ssh_config <ip>` work without
prompts. Everything is removed on exit, including processes still running in the namespaces.

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), iproute2, util-linux `unshare` and openssh-server;
otherwise NetnsUnavailable says what is missing, so tests can skip with that reason.
"""
import ipaddress
import itertools
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import List, Optional

import yaml

from hetu.launch.mpirun import THREAD_VARS

SUBNET_PREFIX = "10.231"
_instances = itertools.count()   # NamespaceHosts made in this process
CMD_TIMEOUT = 20
# What every host's ssh sessions inherit from the caller (sshd otherwise starts them with its
# compiled-in PATH): the same interpreter, libraries and Open MPI (an offline bundle's mpirun
# and orted are found through PATH and OPAL_PREFIX alone).
SESSION_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "OPAL_PREFIX", "MPI4PY_LIBMPI")


class NetnsUnavailable(RuntimeError):
    """This machine cannot make namespace hosts (no privilege, kernel support or tools)."""


@dataclass
class Host:
    index: int
    netns: str              # namespace name, also the host's hostname
    address: str
    peer: str               # the bridge-side end of the host's veth pair
    iface: str = "eth0"     # the host's own end, inside the namespace
    sshd: Optional[subprocess.Popen] = field(default=None, repr=False)

    @property
    def hostname(self) -> str:
        return self.netns


def _run(argv, what, timeout=CMD_TIMEOUT, check=True) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise NetnsUnavailable(f"{what}: {argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: timed out after {timeout} s: {' '.join(argv)}") from None
    if check and res.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(argv)}): {res.stderr.strip()}")
    return res


def sshd_path() -> Optional[str]:
    """$HETU_SSHD, else the system's /usr/sbin/sshd, else the first sshd on PATH (an offline
    bundle's); absolute, as sshd must be to re-execute itself. None if there is none."""
    for path in (os.environ.get("HETU_SSHD"), "/usr/sbin/sshd", shutil.which("sshd")):
        if path and os.access(path, os.X_OK):
            return os.path.abspath(path)
    return None


def _require_tools() -> str:
    for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise NetnsUnavailable(f"{tool} not found on PATH")
    sshd = sshd_path()
    if sshd is None:
        raise NetnsUnavailable("sshd not found in $HETU_SSHD, /usr/sbin/sshd or on PATH "
                               "(install openssh-server)")
    try:
        pwd.getpwnam("sshd")
    except KeyError:
        raise NetnsUnavailable("sshd's privilege-separation user 'sshd' does not exist "
                               "(useradd --system --home-dir /run/sshd sshd)") from None
    return sshd


def _used_subnets() -> set:
    out = _run(["ip", "-o", "-4", "addr", "show"], "listing addresses", check=False).stdout
    out += _run(["ip", "-o", "-4", "route", "show"], "listing routes", check=False).stdout
    return set(re.findall(rf"{re.escape(SUBNET_PREFIX)}\.(\d+)\.", out))


def _pick_net() -> int:
    """A third octet not in use here, so parallel runs (and other tests) do not collide."""
    used = _used_subnets()
    start = os.getpid() % 200
    for k in range(200):
        net = 20 + (start + k) % 200
        if str(net) not in used:
            return net
    raise NetnsUnavailable(f"no free {SUBNET_PREFIX}.x.0/24 subnet left")


class NamespaceHosts:
    def __init__(self, count: int = 2, start_sshd: bool = True, cpus: Optional[List[List[int]]] = None):
        """`cpus`: per host, the cores its processes run on (its sshd's affinity, which every
        process started through it inherits); None: all of this machine's."""
        if not 1 <= count <= 8:
            raise ValueError("count must be between 1 and 8")
        if cpus is not None and (len(cpus) != count or not all(cpus)):
            raise ValueError(f"cpus: one non-empty list of cores per host ({count}), got {cpus}")
        self.count, self.start_sshd, self.cpus = count, start_sshd, cpus
        self.hosts: List[Host] = []
        # Unique per instance, not just per process: a second set of hosts (or a failed one,
        # cleaning up after itself) must never take or delete the first one's namespaces and
        # bridge. Interface names allow 15 characters: "htp" + 5 digits + letter + "h" + index.
        self.tag = f"{os.getpid() % 100000}{chr(ord('a') + next(_instances) % 26)}"
        self.bridge = f"htb{self.tag}"
        self.dir: Optional[str] = None
        self.net: Optional[int] = None
        self.sshd: Optional[str] = None

    # ---- addressing

    @property
    def subnet(self) -> str:
        return f"{SUBNET_PREFIX}.{self.net}.0/24"

    @property
    def gateway(self) -> str:
        """The bridge address, i.e. this (calling) namespace as seen from the hosts."""
        return f"{SUBNET_PREFIX}.{self.net}.1"

    def __getitem__(self, i) -> Host:
        return self.hosts[i]

    def __iter__(self):
        return iter(self.hosts)

    def __len__(self):
        return len(self.hosts)

    # ---- setup

    def __enter__(self):
        self.sshd = _require_tools()
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root (CAP_NET_ADMIN/CAP_SYS_ADMIN)")
        self.dir = tempfile.mkdtemp(prefix="hetu-netns-")
        try:
            self.net = _pick_net()
            self._make_bridge()
            for i in range(self.count):
                self.hosts.append(self._make_host(i))
            if self.start_sshd:
                self._make_keys()
                for h in self.hosts:
                    self._start_sshd(h)
                self._write_ssh_config()
                for h in self.hosts:
                    self._wait_sshd(h)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _make_bridge(self):
        res = _run(["ip", "link", "add", self.bridge, "type", "bridge"], "creating bridge",
                   check=False)
        if res.returncode != 0:
            raise NetnsUnavailable(f"cannot create a bridge: {res.stderr.strip()}")
        _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge], "bridge address")
        _run(["ip", "link", "set", self.bridge, "up"], "bridge up")

    def _make_host(self, i: int) -> Host:
        host = Host(index=i, netns=f"hetu{self.tag}h{i}",
                    address=f"{SUBNET_PREFIX}.{self.net}.{10 + i}", peer=f"htv{self.tag}h{i}")
        res = _run(["ip", "netns", "add", host.netns], "creating namespace", check=False)
        if res.returncode != 0:
            raise NetnsUnavailable(f"cannot create network namespace: {res.stderr.strip()}")
        self.hosts.append(host)   # registered now so close() removes it if the rest fails
        inner = f"htp{self.tag}h{i}"
        _run(["ip", "link", "add", host.peer, "type", "veth", "peer", "name", inner], "veth pair")
        _run(["ip", "link", "set", host.peer, "master", self.bridge, "up"], "veth to bridge")
        _run(["ip", "link", "set", inner, "netns", host.netns], "veth into namespace")
        ns = ["ip", "-n", host.netns]
        _run(ns + ["link", "set", inner, "name", host.iface], "rename veth")
        _run(ns + ["addr", "add", f"{host.address}/24", "dev", host.iface], "host address")
        _run(ns + ["link", "set", host.iface, "up"], "host link up")
        _run(ns + ["link", "set", "lo", "up"], "loopback up")
        self.hosts.pop()
        return host

    # ---- ssh

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _make_keys(self):
        for key in ("host_key", "client_key"):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"hetu-netns-{key}",
                  "-f", self._path(key)], f"generating {key}")
        shutil.copy(self._path("client_key.pub"), self._path("authorized_keys"))
        host_pub = open(self._path("host_key.pub")).read().split()[:2]
        with open(self._path("known_hosts"), "w") as f:
            for h in self.hosts:
                f.write(f"{h.address},{h.hostname} {' '.join(host_pub)}\n")

    def _sshd_config(self, h: Host) -> str:
        path = self._path(f"sshd_{h.index}.conf")
        with open(path, "w") as f:
            f.write("\n".join([
                f"ListenAddress {h.address}", "Port 22", f"HostKey {self._path('host_key')}",
                f"PidFile {self._path(f'sshd_{h.index}.pid')}",
                f"AuthorizedKeysFile {self._path('authorized_keys')}",
                "PermitRootLogin prohibit-password", "PubkeyAuthentication yes",
                "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
                "StrictModes no", "UseDNS no", "PrintMotd no", "LogLevel ERROR",
                "MaxStartups 100", "MaxSessions 100", ""]))
            # one SetEnv line: sshd takes its first and ignores the rest
            pairs = [f'"{k}={os.environ[k]}"' for k in SESSION_ENV if os.environ.get(k)]
            if pairs:
                f.write(f"SetEnv {' '.join(pairs)}\n")
        return path

    def _start_sshd(self, h: Host):
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege-separation dir
        config = self._sshd_config(h)
        # A UTS namespace per host: MPI tells nodes apart by hostname.
        argv = ["ip", "netns", "exec", h.netns, "unshare", "--uts", "sh", "-c",
                f'hostname "$0" && exec "$2" -D -e -f "$1"', h.hostname, config, self.sshd]
        cores = None if self.cpus is None else set(self.cpus[h.index])
        h.sshd = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  start_new_session=True,
                                  preexec_fn=None if cores is None else (lambda: os.sched_setaffinity(0, cores)))

    def _wait_sshd(self, h: Host, timeout: float = 15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if h.sshd.poll() is not None:
                raise RuntimeError(f"sshd on {h.hostname} exited ({h.sshd.returncode}): "
                                   f"{h.sshd.stderr.read().decode(errors='replace').strip()}")
            try:
                with socket.create_connection((h.address, 22), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"timed out after {timeout} s waiting for sshd on {h.hostname} "
                           f"({h.address}:22)")

    def _write_ssh_config(self):
        with open(self.ssh_config, "w") as f:
            for h in self.hosts:
                f.write(f"Host {h.address} {h.hostname}\n  HostName {h.address}\n")
            f.write("\n".join([
                "Host *", "  User root", "  Port 22", f"  IdentityFile {self._path('client_key')}",
                "  IdentitiesOnly yes", f"  UserKnownHostsFile {self._path('known_hosts')}",
                "  StrictHostKeyChecking yes", "  BatchMode yes", "  ConnectTimeout 10",
                "  LogLevel ERROR", ""]))

    @property
    def ssh_config(self) -> str:
        return self._path("ssh_config")

    def ssh(self, host: Host, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Runs a shell command on `host` over ssh; raises on timeout, returns the result."""
        argv = ["ssh", "-F", self.ssh_config, host.address, command]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"ssh {host.hostname} {command!r}: timed out after {timeout} s") \
                from None

    def exec_argv(self, host: Host, argv: List[str]) -> List[str]:
        """argv that runs a command directly inside the host's namespace (no ssh)."""
        return ["ip", "netns", "exec", host.netns, *argv]

    # ---- cluster file

    def cluster(self, workers: List[int], servers: Optional[List[int]] = None,
                chief: int = 0, env: Optional[dict] = None) -> dict:
        """A runner cluster description naming the hosts by address.

        The hosts share this machine's cores, so unless `env` says otherwise each worker gets
        its share of them as thread count (the runner would give every host's workers all of
        them, and the workers of different hosts would spin against each other)."""
        servers = servers or [0] * len(self.hosts)
        if self.cpus is None:
            threads = str(max(1, len(os.sched_getaffinity(0)) // max(1, sum(workers))))
        else:   # the cores of each worker's own host
            threads = str(max(1, min(len(c) // w for c, w in zip(self.cpus, workers) if w)))
        env = {**{v: threads for v in THREAD_VARS}, **(env or {})}
        nodes = [{"host": h.address, "workers": w, "servers": s, "interface": h.iface,
                  **({"chief": True} if h.index == chief else {})}
                 for h, w, s in zip(self.hosts, workers, servers)]
        # Keep MPI's own traffic on the test subnet; the caller's other interfaces are not
        # reachable from inside the namespaces.
        mca = ["--mca", "oob_tcp_if_include", self.subnet,
               "--mca", "btl_tcp_if_include", self.subnet]
        return {"nodes": nodes, "ssh_config": self.ssh_config, "mpirun_args": mca, "env": env}

    def write_cluster_file(self, path, workers, servers=None, chief=0, env=None) -> str:
        with open(path, "w") as f:
            yaml.safe_dump(self.cluster(workers, servers, chief, env), f, sort_keys=False)
        return str(path)

    # ---- teardown

    def close(self):
        for h in self.hosts:
            self._kill_namespace_processes(h)
        for h in self.hosts:
            if h.sshd is not None:
                try:
                    h.sshd.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    h.sshd.kill()
            _run(["ip", "netns", "del", h.netns], f"deleting {h.netns}", check=False)
            _run(["ip", "link", "del", h.peer], f"deleting {h.peer}", check=False)
        self.hosts = []
        _run(["ip", "link", "del", self.bridge], "deleting bridge", check=False)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    @staticmethod
    def _kill_namespace_processes(h: Host):
        """sshd sessions and whatever they started outlive sshd itself; end them all."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = _run(["ip", "netns", "pids", h.netns], "listing namespace pids",
                        check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), sig)
                except (ProcessLookupError, ValueError):
                    pass
            if not pids:
                return
            time.sleep(0.2)


# --------------------------------------------------------------------------- traffic shaping

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def rate_bits(rate: str) -> float:
    """tc rate string -> bits per second (tc's units: 'bit' suffixes are bits, 'bps' bytes)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]+)\s*", rate)
    if not m or m.group(2).lower() not in _RATE_UNITS:
        raise ValueError(f"rate {rate!r}: expected e.g. 1gbit, 50mbit, 10mbps")
    return float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]


def _tc(prefix: List[str], args: List[str], what: str):
    res = _run(prefix + args, what, check=False)
    if res.returncode != 0:
        hint = " (kernel module sch_netem not available?)" if "netem" in args else ""
        raise NetnsUnavailable(f"tc refused {what}{hint}: {res.stderr.strip()}")


def _shape_dev(prefix: List[str], dev: str, rate: Optional[str], delay: Optional[str]):
    _run(prefix + ["qdisc", "del", "dev", dev, "root"], "clearing qdisc", check=False)
    parent = ["root"]
    if delay:
        _tc(prefix, ["qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
                     "delay", delay], f"netem delay {delay} on {dev}")
        parent = ["parent", "1:1"]
    if rate:
        # A burst of at least one GSO segment and ~4 ms of traffic, so TCP is not starved.
        burst = max(int(rate_bits(rate) / 8 / 250), 65536)
        _tc(prefix, ["qdisc", "add", "dev", dev, *parent, "handle", "10:", "tbf", "rate", rate,
                     "burst", str(burst), "latency", "100ms"], f"tbf rate {rate} on {dev}")


def shape(host: Host, rate: Optional[str] = "1gbit", delay: Optional[str] = "0.1ms"):
    """Gives the link between `host` and the bridge a rate (tbf) and a one-way delay (netem),
    both ways. rate=None or delay=None leaves that part out: some kernels lack sch_netem, and
    then asking for a delay raises NetnsUnavailable rather than silently shaping less."""
    if shutil.which("tc") is None:
        raise NetnsUnavailable("tc not found on PATH (install iproute2)")
    if rate:
        rate_bits(rate)
    try:
        _shape_dev(["tc", "-n", host.netns], host.iface, rate, delay)
        _shape_dev(["tc"], host.peer, rate, delay)
    except NetnsUnavailable:
        unshape(host)
        raise


def unshape(host: Host):
    _run(["tc", "-n", host.netns, "qdisc", "del", "dev", host.iface, "root"], "unshape",
         check=False)
    _run(["tc", "qdisc", "del", "dev", host.peer, "root"], "unshape", check=False)


def check_address_is_test_host(hosts: NamespaceHosts, address: str):
    """Guards helpers that send traffic: only the test subnet or loopback."""
    ip = ipaddress.ip_address(address)
    if not (ip.is_loopback or ip in ipaddress.ip_network(hosts.subnet)):
        raise ValueError(f"{address} is outside the test subnet {hosts.subnet}")
