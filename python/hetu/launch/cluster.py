"""The cluster file: which hosts run how many servers and workers, and how to reach them."""
import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import yaml

NODE_KEYS = {"host", "servers", "workers", "chief", "gpus", "ssh_port", "user", "python", "interface",
             "server_threads"}
TOP_KEYS = {"nodes", "env", "van", "ssh_config", "mpirun_args"}
VANS = {"zmq", "ucx"}  # ucx: RDMA verbs where the hosts have them, else shared memory / TCP


class ConfigError(Exception):
    """A cluster file or command line that cannot describe a job."""


# --------------------------------------------------------------------------- cluster description

@dataclass
class Node:
    host: str
    servers: int = 0
    workers: int = 0
    chief: bool = False
    gpus: int = 0             # GPUs on this host, exported to its workers as HETU_GPUS (0: none declared)
    ssh_port: Optional[int] = None
    user: Optional[str] = None
    python: Optional[str] = None
    interface: Optional[str] = None
    # Threads of each server's gather and optimizer step (HETU_NUM_THREADS of this host's
    # servers; 0: not set, the servers take the environment's or every core).
    server_threads: int = 0


@dataclass
class Cluster:
    nodes: List[Node]
    env: Dict[str, str] = field(default_factory=dict)
    van: str = "zmq"
    ssh_config: Optional[str] = None
    mpirun_args: List[str] = field(default_factory=list)

    @property
    def chief(self) -> Node:
        return next(n for n in self.nodes if n.chief)

    @property
    def num_workers(self) -> int:
        return sum(n.workers for n in self.nodes)

    @property
    def num_servers(self) -> int:
        return sum(n.servers for n in self.nodes)


def _count(raw, key, where):
    value = raw.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: '{key}' must be an integer, got {value!r}")
    if value < 0:
        raise ConfigError(f"{where}: '{key}' must not be negative, got {value}")
    return value


def _parse_node(raw, index, source) -> Node:
    where = f"{source}: nodes[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with 'host', got {raw!r}")
    host = raw.get("host")
    if isinstance(host, str) and host.strip():
        where = f"{where} (host {host})"
    unknown = sorted(set(raw) - NODE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} "
                          f"(allowed: {', '.join(sorted(NODE_KEYS))})")
    if not isinstance(host, str) or not host.strip():
        raise ConfigError(f"{where}: missing 'host'")
    chief = raw.get("chief", False)
    if not isinstance(chief, bool):
        raise ConfigError(f"{where}: 'chief' must be true or false, got {chief!r}")
    port = raw.get("ssh_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 0 < port < 65536):
        raise ConfigError(f"{where}: 'ssh_port' must be a port number, got {port!r}")
    for key in ("user", "python", "interface"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigError(f"{where}: '{key}' must be a string, got {raw[key]!r}")
    server_threads = _count(raw, "server_threads", where)
    if "server_threads" in raw and server_threads < 1:
        raise ConfigError(f"{where}: 'server_threads' must be at least 1, got {server_threads}")
    return Node(host=host.strip(), servers=_count(raw, "servers", where),
                workers=_count(raw, "workers", where), chief=chief, gpus=_count(raw, "gpus", where),
                ssh_port=port,
                user=raw.get("user"), python=raw.get("python"), interface=raw.get("interface"),
                server_threads=server_threads)


def _check_cluster(nodes: List[Node], source):
    chiefs = [n.host for n in nodes if n.chief]
    if not chiefs:
        raise ConfigError(f"{source}: no node has 'chief: true' (exactly one node must be the chief; "
                          "the scheduler runs there)")
    if len(chiefs) > 1:
        raise ConfigError(f"{source}: more than one chief: {', '.join(chiefs)} (exactly one node must "
                          "have 'chief: true')")
    if sum(n.workers for n in nodes) == 0:
        raise ConfigError(f"{source}: zero workers in total: at least one node needs 'workers' > 0")
    hosts = [n.host for n in nodes]
    dup = sorted({h for h in hosts if hosts.count(h) > 1})
    if dup:
        raise ConfigError(f"{source}: host listed more than once: {', '.join(dup)} "
                          "(put all its servers and workers on one node entry)")


def parse_cluster(data, source="cluster file") -> Cluster:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with 'nodes', got {type(data).__name__}")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {', '.join(unknown)} "
                          f"(allowed: {', '.join(sorted(TOP_KEYS))})")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError(f"{source}: 'nodes' must be a non-empty list")
    nodes = [_parse_node(raw, i, source) for i, raw in enumerate(raw_nodes)]
    _check_cluster(nodes, source)
    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{source}: 'env' must be a mapping of NAME: value")
    van = data.get("van", "zmq")
    if van not in VANS:
        raise ConfigError(f"{source}: 'van' must be one of {', '.join(sorted(VANS))}, got {van!r}")
    mpirun_args = data.get("mpirun_args") or []
    if not isinstance(mpirun_args, list) or not all(isinstance(a, str) for a in mpirun_args):
        raise ConfigError(f"{source}: 'mpirun_args' must be a list of strings")
    ssh_config = data.get("ssh_config")
    if ssh_config is not None and not os.path.isfile(str(ssh_config)):
        raise ConfigError(f"{source}: 'ssh_config' file not found: {ssh_config}")
    return Cluster(nodes=nodes, env={str(k): str(v) for k, v in env.items()}, van=van,
                   ssh_config=os.path.abspath(ssh_config) if ssh_config else None,
                   mpirun_args=mpirun_args)


def load_cluster(path) -> Cluster:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read cluster file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text file (the byte at offset {e.start} is not UTF-8); "
                          "a cluster file is YAML") from None
    except yaml.YAMLError as e:
        # One line: the problem and where (PyYAML's own text spans several).
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    return parse_cluster(data, source=path)


def local_cluster(workers: int, servers: int, gpus: int = 0) -> Cluster:
    return parse_cluster({"nodes": [{"host": "localhost", "workers": workers,
                                     "servers": servers, "chief": True, "gpus": gpus}]},
                         source="-w/-s")


# --------------------------------------------------------------------------- hosts and addresses

def is_local(host: str) -> bool:
    """True when `host` names this machine (this network namespace): binding to it succeeds."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return False
    if ipaddress.ip_address(addr).is_loopback:
        return True
    with socket.socket() as s:
        try:
            s.bind((addr, 0))
            return True
        except OSError:
            return False


def resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise ConfigError(f"cannot resolve host {host!r}") from None


def root_address(cluster: Cluster) -> str:
    """The address every node uses to reach the scheduler on the chief."""
    chief = cluster.chief
    remote = [n.host for n in cluster.nodes if not is_local(n.host)]
    addr = resolve(chief.host)
    loopback = [n.host for n in cluster.nodes if ipaddress.ip_address(resolve(n.host)).is_loopback]
    if remote and loopback:
        raise ConfigError(f"host {loopback[0]!r} is a loopback name but nodes "
                          f"{', '.join(remote)} are remote: name it by an address they can reach")
    return "127.0.0.1" if not remote and is_local(chief.host) else addr

