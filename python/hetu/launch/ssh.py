"""ssh command lines for the remote hosts of a cluster."""
import os
import shlex
from typing import Dict, List, Optional

from .cluster import Cluster


class Ssh:
    """ssh command lines for the cluster's remote hosts, through one generated config file, so
    the runner and mpirun's daemons use the same ports, users and options."""

    def __init__(self, cluster: Cluster, workdir: str):
        self.config = os.path.join(workdir, "ssh_config")
        with open(self.config, "w") as f:
            f.write(self._config_text(cluster))

    @staticmethod
    def _config_text(cluster: Cluster) -> str:
        lines = []
        for n in cluster.nodes:
            if n.ssh_port or n.user:
                lines.append(f"Host {n.host}")
                lines += [f"  Port {n.ssh_port}"] if n.ssh_port else []
                lines += [f"  User {n.user}"] if n.user else []
        # Later files only fill in what the per-node blocks above left unset.
        lines.append("Match all")
        user_config = cluster.ssh_config or os.path.expanduser("~/.ssh/config")
        if os.path.isfile(user_config):
            lines.append(f"  Include {user_config}")
        lines += ["  BatchMode yes", "  ConnectTimeout 10", "  ServerAliveInterval 5",
                  "  ServerAliveCountMax 3"]
        return "\n".join(lines) + "\n"

    def argv(self, host: str, remote_command: str) -> List[str]:
        return ["ssh", "-F", self.config, "-o", "BatchMode=yes", host, remote_command]


def remote_command(cwd: str, env: Dict[str, str], argv: List[str], secret_var: Optional[str] = None) -> str:
    """A shell line that runs argv on a remote host and kills it when the local ssh goes away.

    Closing ssh does not signal a remote command without a tty, so a watchdog waits for EOF on
    the session's stdin (the runner holds the other end) and terminates the command then.
    With `secret_var`, the first line of stdin is exported as that variable first: a value
    there never appears on a command line (ssh's, or the remote shell's and the command's).
    """
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    cmd = " ".join(shlex.quote(a) for a in argv)
    # `read` is a shell builtin: the value stays out of every process's argv.
    secret = f"IFS= read -r {secret_var} && export {secret_var} && " if secret_var else ""
    # Background jobs of a non-interactive shell read /dev/null, so the watchdog gets the
    # session's stdin through fd 3 explicitly.
    return (f"{secret}cd {shlex.quote(cwd)} && exec 3<&0 && {{ env {assigns} {cmd} 3<&- & p=$!; "
            f"{{ cat <&3 >/dev/null; kill -TERM $p; sleep 5; kill -KILL $p; }} "
            f">/dev/null 2>&1 & w=$!; exec 3<&-; wait $p; rc=$?; kill $w 2>/dev/null; "
            f"exit $rc; }}")

