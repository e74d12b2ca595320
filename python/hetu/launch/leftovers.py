"""Open MPI's files of a job on this host, removed however the job ended.

mpirun removes its session folder ($TMPDIR/ompi.HOST.UID/pid.PID) and its ranks' shared-memory
segments (/dev/shm/vader_segment.HOST.UID.JOBID.RANK, 8 MiB each) when it ends by itself. When
it or a rank dies by a signal they stay, and nothing else of Open MPI ever removes them. The
launcher (job.py) and its guard (guard.py) remove them after the job's processes are gone:
the session folder of the job's mpirun, the segments of the job id in its contact.txt, and any
segment a process of the job had mapped (read while the job ran, in case the folder is gone).
"""
import glob
import os
import shutil
import tempfile
from typing import Iterable, List

SHM = "/dev/shm"


def mpi_session_folders(mpirun_pids: Iterable[int]) -> List[str]:
    """Open MPI 4's session folders of these mpirun processes: TMPDIR/ompi.HOST.UID/pid.PID."""
    base = tempfile.gettempdir()   # TMPDIR, TEMP, TMP, else /tmp: where Open MPI puts them too
    return [f for pid in mpirun_pids for f in glob.glob(os.path.join(base, f"ompi.*.{os.getuid()}", f"pid.{pid}"))]


def mpi_job_families(sessions: Iterable[str]) -> List[int]:
    """The job families of the session folders' mpirun: contact.txt begins "JOBID.VPID;"."""
    families = []
    for folder in sessions:
        try:
            with open(os.path.join(folder, "contact.txt")) as f:
                families.append(int(f.read().split(".", 1)[0]) >> 16)
        except (OSError, ValueError):
            continue
    return families


def mapped_segments(pids: Iterable[int]) -> List[str]:
    """The /dev/shm files these processes have mapped (Open MPI's shared-memory segments)."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    fields = line.split(maxsplit=5)   # address, perms, offset, dev, inode[, path]
                    if len(fields) == 6 and fields[5].startswith(SHM + "/vader_segment."):
                        found.add(fields[5].strip())
        except OSError:
            continue
    return sorted(found)


def family_segments(families: Iterable[int]) -> List[str]:
    """/dev/shm/vader_segment.HOST.UID.JOBID.RANK of these job families (JOBID in hex)."""
    families = set(families)
    out = []
    for path in glob.glob(os.path.join(SHM, "vader_segment.*")):
        try:
            if int(path.rsplit(".", 2)[1], 16) >> 16 in families:
                out.append(path)
        except (IndexError, ValueError):
            continue
    return out


class OpenMpiFiles:
    """What one job's mpirun left on this host: note() while the job's processes run (their
    mapped segments, the session folder and its job id), remove() once they are gone."""

    def __init__(self, mpirun_pids: Iterable[int]):
        self.mpirun_pids = list(mpirun_pids)
        self.sessions: List[str] = []
        self.families: List[int] = []
        self.segments: List[str] = []

    def note(self, pids: Iterable[int]):
        for folder in mpi_session_folders(self.mpirun_pids):
            if folder not in self.sessions:
                self.sessions.append(folder)
        self.families = sorted(set(self.families) | set(mpi_job_families(self.sessions)))
        self.segments = sorted(set(self.segments) | set(mapped_segments(pids)))

    def remove(self):
        self.note([])   # a session folder made since the last note
        for folder in self.sessions:
            shutil.rmtree(folder, ignore_errors=True)
        for path in set(self.segments) | set(family_segments(self.families)):
            try:
                os.remove(path)
            except OSError:
                pass
