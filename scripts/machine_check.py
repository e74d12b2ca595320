"""What this machine has for scripts/gpu_suite.sh: GPU, CuPy, cores, MPI, and whether namespace
hosts can be made here (network namespaces, veth pairs, tbf, and an sshd that starts), each tried
for real and cleaned up. Prints one line per fact and writes OUTDIR/machine.txt and machine.json;
`network` says how the cluster part runs: netns (shaped namespace hosts) or loopback.

    python scripts/machine_check.py OUTDIR
"""
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def run(cmd, timeout=30):
    """(ok, output) of a shell command."""
    try:
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
        return p.returncode == 0, (p.stdout + p.stderr).strip()
    except Exception as e:   # noqa: BLE001 - a fact, not a failure of the check
        return False, str(e)


def tool(name):
    return shutil.which(name) or "missing"


def sshd_path():
    try:
        from hetu_tools.netns import sshd_path as find
        return find()
    except ImportError:
        return next((p for p in ("/usr/sbin/sshd", shutil.which("sshd")) if p and os.access(p, os.X_OK)), None)


def ensure_sshd_user():
    """sshd (OpenSSH < 9.8 and Debian's) refuses to start without its privilege-separation
    user; a bare GPU machine's image has none. Added only when missing and we are root."""
    try:
        pwd.getpwnam("sshd")
        return "present"
    except KeyError:
        pass
    if os.geteuid() != 0:
        return "missing (not root: cannot add it)"
    if shutil.which("useradd"):
        ok, out = run("useradd --system --no-create-home --home-dir /run/sshd --shell /usr/sbin/nologin sshd")
    else:
        with open("/etc/passwd", "a") as f:
            f.write("sshd:x:199:65534::/run/sshd:/usr/sbin/nologin\n")
        ok, out = True, ""
    return "added" if ok else f"missing (adding it failed: {out[:200]})"


def sshd_starts(sshd):
    """Starts `sshd` on a free loopback port with throwaway keys and runs a command through it."""
    if sshd is None:
        return "no (no sshd)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "no (no ssh or ssh-keygen)"
    d = tempfile.mkdtemp(prefix="hetu-sshd-check-")
    proc = None
    try:
        for key in ("host", "client"):
            ok, out = run(f"ssh-keygen -q -t ed25519 -N '' -f {d}/{key}")
            if not ok:
                return f"no (ssh-keygen: {out[:200]})"
        shutil.copy(f"{d}/client.pub", f"{d}/authorized_keys")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(f"{d}/sshd.conf", "w") as f:
            f.write(f"ListenAddress 127.0.0.1:{port}\nHostKey {d}/host\nPidFile {d}/sshd.pid\n"
                    f"AuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\nUsePAM no\n"
                    "StrictModes no\nPasswordAuthentication no\nLogLevel ERROR\n")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        proc = subprocess.Popen([sshd, "-D", "-e", "-f", f"{d}/sshd.conf"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        if proc.poll() is not None:
            return f"no (sshd exited {proc.returncode}: {proc.stderr.read().strip()[:200]})"
        ok, out = run(f"ssh -i {d}/client -p {port} -o BatchMode=yes -o StrictHostKeyChecking=no "
                      f"-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR {pwd.getpwuid(os.getuid()).pw_name}"
                      f"@127.0.0.1 echo hetu-ok")
        return "yes" if ok and "hetu-ok" in out else f"no (ssh through it: {out[:200]})"
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
        shutil.rmtree(d, ignore_errors=True)


def kernel_facts(facts):
    """netns, veth, tbf: each tried for real (and removed), with the refusal's reason."""
    ns, a, b = "hetu-suite-check", "hsc0", "hsc1"
    ok, out = run(f"ip netns add {ns}")
    facts["netns"] = "yes" if ok else f"no ({out[:200]})"
    if ok:
        ok, out = run(f"ip link add {a} type veth peer name {b} netns {ns}")
        facts["veth"] = "yes" if ok else f"no ({out[:200]})"
    else:
        facts["veth"] = "not tried (no netns)"
    if facts["veth"] == "yes":
        ok, out = run(f"tc qdisc add dev {a} root tbf rate 1gbit burst 1mb latency 50ms")
        facts["tbf"] = "yes" if ok else f"no ({out[:200]})"
    else:
        facts["tbf"] = "not tried (no veth)"
    run(f"ip link del {a}")
    run(f"ip netns del {ns}")


def main():
    out = sys.argv[1]
    facts = {}
    ok, smi = run("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader")
    facts["gpu"] = smi.splitlines()[0] if ok and smi else "none found (no nvidia-smi answer)"
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
        facts["cupy"] = f"{cupy.__version__}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, {n} device(s)"
    except Exception as e:   # noqa: BLE001
        facts["cupy"] = f"unavailable ({type(e).__name__})"
    facts["cpu"] = run("lscpu | sed -n 's/^Model name: *//p'")[1] or "?"
    facts["cores"] = len(os.sched_getaffinity(0))
    facts["python"] = sys.version.split()[0]
    facts["mpirun"] = (run("mpirun --version")[1].splitlines() or ["?"])[0] if shutil.which("mpirun") else "missing"
    for name in ("ip", "tc", "ssh", "unshare"):
        facts[name] = tool(name)
    sshd = sshd_path()
    facts["sshd"] = sshd or "missing"
    facts["root"] = "yes" if os.geteuid() == 0 else "no"
    if shutil.which("ip") and os.geteuid() == 0:
        kernel_facts(facts)
    else:
        for k in ("netns", "veth", "tbf"):
            facts[k] = "not tried (" + ("no ip" if not shutil.which("ip") else "not root") + ")"
    facts["sshd_user"] = ensure_sshd_user() if sshd else "not needed (no sshd)"
    facts["sshd_starts"] = sshd_starts(sshd)
    needs = {k: facts[k] for k in ("netns", "veth", "tbf", "sshd_starts")}
    lacking = [f"{k} {v}" for k, v in needs.items() if v != "yes"]
    if facts["unshare"] == "missing":
        lacking.append("no unshare")
    facts["network"] = "netns" if not lacking else "loopback"
    if lacking:
        facts["network_why"] = "; ".join(lacking)
    try:
        import hetu
        facts["hetu"] = hetu.__file__
    except Exception as e:   # noqa: BLE001
        facts["hetu"] = f"not importable ({e})"
    lines = [f"{k:12s} {v}" for k, v in facts.items()]
    print("\n".join(lines))
    with open(os.path.join(out, "machine.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "machine.json"), "w") as f:
        json.dump(facts, f, indent=1)


if __name__ == "__main__":
    main()
