"""The command lines of a training run, and running one with its failure named."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = sys.executable


def script(name):
    """A training driver of examples/ctr (run_hetu.py, run_laia.py) as a command."""
    return [PYTHON, os.path.join(ROOT, "examples/ctr", name)]


def runner(workers, servers, timeout=None, extra=()):
    """python/runner.py's part of a local cluster's command: W workers and S servers on this
    machine (`extra`: the launcher's other flags), the worker command to follow."""
    cmd = [PYTHON, os.path.join(ROOT, "python/runner.py"), "-w", str(workers), "-s", str(servers)]
    return cmd + (["--timeout", f"{timeout:g}"] if timeout is not None else []) + list(extra)


def run(cmd, what, timeout, env=None, **kwargs):
    """subprocess.run capturing text output; exits naming `what` with the output's tail when the
    command fails or times out."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""   # bytes on POSIX, whatever text= says
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        sys.exit(f"{what}: no end after {timeout:g} s:\n{out[-3000:]}")
    if proc.returncode != 0:
        sys.exit(f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc
