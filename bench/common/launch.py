"""The command lines of a training run, running one with its failure named, and the environment
of a process that imports another build of hetu (a baseline)."""
import os
import subprocess
import sys
import tempfile

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


# Written where a baseline's processes find it first: Python imports it at start-up, after the
# site's .pth files, one of which installs an editable install's finder (scikit-build-core's),
# which would otherwise answer every `import hetu` with this checkout's package.
_BASELINE_SITE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "ScikitBuildRedirectingFinder"]
sys.path.insert(0, {folder!r})
"""


def baseline_env(folder, env=None):
    """A copy of `env` (default os.environ) whose Python processes import hetu from `folder` (a
    folder holding another build's `hetu` package with its compiled modules, e.g. a worktree's
    python/ with _C and _ps copied in), even where this checkout is installed editable."""
    folder = os.path.abspath(folder)
    if not os.path.isdir(os.path.join(folder, "hetu")):
        sys.exit(f"--baseline {folder}: no hetu package there")
    site = tempfile.mkdtemp(prefix="hetu-baseline-")
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(_BASELINE_SITE.format(folder=folder))
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([site, folder] + [p for p in [env.get("PYTHONPATH")] if p])
    return env
