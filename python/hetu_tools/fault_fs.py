"""A FUSE file system that passes a backing folder through and fails its files' I/O with EIO on
demand: the disk tier's tests (docs/design.md, "Disk tier") put a row file on it to meet a real
I/O error ("Input/output error") where device-mapper's error targets are not to be had.

    python -m hetu_tools.fault_fs BACKING MOUNTPOINT

mounts BACKING at MOUNTPOINT and serves until unmounted (`fusermount -u MOUNTPOINT`) or sent
SIGTERM. The faults are switched by a control file, BACKING/.faults, that holds the words of
the faults on now (re-read at every operation, so a test switches them between two calls):
- `read`: every read of a file fails with EIO;
- `write`: every change of a file's data fails with EIO: writes, truncations and syncs (what a
  disk that stops taking writes does); creating, renaming and removing files still work.
No control file, or an empty one, is no fault. A word it does not know fails the operation that
read it and stops the daemon (exit 1, one line naming the file and the word; the mount goes
away): no test runs on faults it did not mean.

The mount uses direct I/O: every pread and pwrite reaches the daemon, none is answered from the
kernel's page cache, so a fault switched on is met by the next call. Locks are the kernel's
local ones (the daemon implements none): an exclusive flock works among the processes of this
machine, which is what the row file's lock is for.

Built on fusepy (ctypes over libfuse 2: Debian's `fuse` and `libfuse2`): pure Python, nothing to
compile, and its synchronous, threaded callbacks make a passthrough a few lines each; pyfuse3
would need libfuse3's headers to build and an async (trio) loop for the same.

In Python, FaultFS mounts one for the duration of a `with` block:

    with FaultFS(backing, mountpoint) as fs:
        fs.set_faults("read")       # later reads of files under mountpoint fail with EIO
        fs.set_faults()             # none again

(set_faults(backing, ...) does the same from any process: a job's worker, say).

FaultFsUnavailable (with the reason) where it cannot: no /dev/fuse, no fusepy, no libfuse or
fusermount, or the mount refused; tests skip with that reason.
"""
import argparse
import errno
import os
import shutil
import subprocess
import sys
import time

CONTROL = ".faults"
FAULTS = ("read", "write")


class FaultFsUnavailable(RuntimeError):
    pass


def parse_faults(text, where):
    """The set of fault words in `text`; ValueError naming the unknown word and `where`."""
    words = set(text.split())
    unknown = sorted(words - set(FAULTS))
    if unknown:
        raise ValueError(f"{where}: unknown fault {unknown[0]!r} (known: {', '.join(FAULTS)})")
    return words


def set_faults(backing, *faults):
    """The faults on from now for the mount of `backing` (from any process): "read", "write",
    both, or none."""
    text = " ".join(faults)
    parse_faults(text, "fault_fs.set_faults")
    path = os.path.join(backing, CONTROL)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)   # never half-written when the daemon reads it


def make_operations(backing):
    """The passthrough of `backing` with its faults (imported here: fusepy is optional)."""
    from fuse import FuseOSError, Operations, fuse_exit

    control = os.path.join(backing, CONTROL)

    class FaultOperations(Operations):
        use_ns = True      # utimens and getattr times in nanoseconds
        bad_control = ""   # why the daemon stopped: the control file's unknown word

        def _full(self, path):
            return os.path.join(backing, path.lstrip("/"))

        def _fail_if(self, fault):
            try:
                with open(control) as f:
                    text = f.read()
            except FileNotFoundError:
                return
            try:
                words = parse_faults(text, control)
            except ValueError as e:
                self.bad_control = str(e)
                fuse_exit()
                raise FuseOSError(errno.EIO)
            if fault in words:
                raise FuseOSError(errno.EIO)

        # Files and folders: passed through (fusepy answers an OSError with its errno).
        def access(self, path, mode):
            if not os.access(self._full(path), mode):
                raise FuseOSError(errno.EACCES)

        def chmod(self, path, mode):
            os.chmod(self._full(path), mode)

        def chown(self, path, uid, gid):
            os.chown(self._full(path), uid, gid)

        def getattr(self, path, fh=None):
            st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
            attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                 "st_blocks", "st_blksize", "st_ino", "st_dev")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            return attrs

        def readdir(self, path, fh):
            return [".", ".."] + os.listdir(self._full(path))

        def readlink(self, path):
            return os.readlink(self._full(path))

        def mknod(self, path, mode, dev):
            os.mknod(self._full(path), mode, dev)

        def mkdir(self, path, mode):
            os.mkdir(self._full(path), mode)

        def rmdir(self, path):
            os.rmdir(self._full(path))

        def unlink(self, path):
            os.unlink(self._full(path))

        def symlink(self, target, source):
            os.symlink(source, self._full(target))

        def link(self, target, source):
            os.link(self._full(source), self._full(target))

        def rename(self, old, new):
            os.rename(self._full(old), self._full(new))

        def utimens(self, path, times=None):
            os.utime(self._full(path), ns=times)

        def statfs(self, path):
            st = os.statvfs(self._full(path))
            return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        def open(self, path, flags):
            return os.open(self._full(path), flags)

        def create(self, path, mode, fi=None):
            # fusepy passes no open flags here: read and write, whatever the caller asked.
            return os.open(self._full(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

        def flush(self, path, fh):
            return 0   # the data is in the backing file already (each write is a pwrite)

        def release(self, path, fh):
            os.close(fh)

        # The data: where the faults are.
        def read(self, path, size, offset, fh):
            self._fail_if("read")
            return os.pread(fh, size, offset)

        def write(self, path, data, offset, fh):
            self._fail_if("write")
            return os.pwrite(fh, data, offset)

        def truncate(self, path, length, fh=None):
            self._fail_if("write")
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._full(path), length)

        def fsync(self, path, datasync, fh):
            self._fail_if("write")
            (os.fdatasync if datasync else os.fsync)(fh)

    return FaultOperations()


def serve(backing, mountpoint):
    """Mounts and serves in this process until unmounted (a signal unmounts it too); "" or why
    it stopped on its own."""
    from fuse import FUSE
    operations = make_operations(backing)
    FUSE(operations, mountpoint, foreground=True, nothreads=False, direct_io=True, fsname="fault_fs")
    return operations.bad_control


class FaultFS:
    """`backing` mounted at `mountpoint` by a daemon of this module, in a `with` block."""

    def __init__(self, backing, mountpoint, timeout=10.0):
        self.backing, self.mountpoint, self.timeout = str(backing), str(mountpoint), timeout
        self.proc = None

    def set_faults(self, *faults):
        """The faults on from now: "read", "write", both, or none."""
        set_faults(self.backing, *faults)

    def __enter__(self):
        missing = unavailable()
        if missing:
            raise FaultFsUnavailable(missing)
        self.set_faults()
        self.proc = subprocess.Popen([sys.executable, "-m", "hetu_tools.fault_fs", self.backing, self.mountpoint],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.timeout
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                said = self._stop()
                raise FaultFsUnavailable(f"cannot mount a FUSE file system at {self.mountpoint}: {said or 'timed out'}")
            time.sleep(0.02)
        return self

    def _stop(self):
        """Unmounts (lazily: a process may still hold a file there) and ends the daemon; its output."""
        if os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount", "-u", "-z", self.mountpoint], capture_output=True)
        try:
            out, _ = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out.decode(errors="replace").strip()

    def __exit__(self, *exc):
        self._stop()


def unavailable():
    """Why no FaultFS can be mounted here, or ""."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount") is None:
        return "no fusermount (Debian package fuse)"
    try:
        import fuse  # noqa: F401 (fusepy: loads libfuse.so.2)
    except ImportError as e:
        return f"fusepy is not installed (pip install fusepy): {e}"
    except OSError as e:   # fusepy's "Unable to find libfuse"
        return f"fusepy cannot load libfuse 2 (Debian package libfuse2): {e}"
    return ""


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hetu_tools.fault_fs", description=__doc__.split("\n\n")[0])
    parser.add_argument("backing", help="the folder whose files the mount shows")
    parser.add_argument("mountpoint", help="an empty folder to mount it at")
    args = parser.parse_args(argv)
    for what, path in (("backing folder", args.backing), ("mount point", args.mountpoint)):
        if not os.path.isdir(path):
            parser.exit(2, f"fault_fs: the {what} {path} is not a folder\n")
    missing = unavailable()
    if missing:
        parser.exit(2, f"fault_fs: {missing}\n")
    try:
        stopped = serve(os.path.abspath(args.backing), args.mountpoint)
    except RuntimeError as e:
        parser.exit(1, f"fault_fs: mounting {args.backing} at {args.mountpoint} failed: {e}\n")
    if stopped:
        parser.exit(1, f"fault_fs: {stopped}\n")


if __name__ == "__main__":
    main()
