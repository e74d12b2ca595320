"""python -m hetu.launcher: runs this process as the ps-lite scheduler or a server.

The role comes from DMLC_ROLE (scheduler or server), the rest of the job from the other
DMLC_* variables. Exits 0 once every worker has finalised; exits 1 with a message naming the
node if a peer dies (no heartbeat for PS_HEARTBEAT_TIMEOUT seconds) or rendezvous fails.
"""
import os
import sys

from hetu import ps, threads


def main():
    role = os.environ.get("DMLC_ROLE")
    if role not in ("scheduler", "server"):
        print(f"hetu.launcher: DMLC_ROLE must be scheduler or server, not {role!r}", file=sys.stderr)
        return 2
    threads.configure()   # its share of the host's cores, unless the environment or server_threads says
    try:
        ps.start()
    except RuntimeError as e:
        print(f"hetu.launcher: {role} failed to start: {e}", file=sys.stderr)
        return 1
    name = f"{role} {ps.rank()}" if role == "server" else role
    try:
        why = None
        while why is None:  # short waits keep Ctrl-C responsive
            why = ps.wait_for_end(0.5)
    except KeyboardInterrupt:
        why = "interrupted"
    if role == "server":
        print(ps.served_line(ps.rank(), ps.own_server_stats()), flush=True)
    ps.finalize()
    if why:
        print(f"hetu.launcher: {name}: job failed: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
