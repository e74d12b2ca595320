"""Live updates: the server follows a training job's checkpoint folder and serves each new version.

A training job replaces its full checkpoint by renames and adds deltas under deltas/ (each renamed
into place whole; hetu.checkpoint). The watcher reads the folder's version (meta.json only) twenty
times a second; when it rises above the served one (or a first one lands, where the server started
without a bundle), it exports the checkpoint into a fresh bundle folder, opens
it and swaps it in (ServedBundle.swap): the batches from then on run on it, those running finish
on the old one, whose folder goes once the last of them ends. A checkpoint replaced while it is
read is read again by export (hetu.serve.export.read_checkpoint); an export that still fails is
tried again at a later look. A chain of deltas with a break (a delta missing, one following another
save) is said in one line and served up to the break; a checkpoint of another model (another name,
or a run record that differs in what makes the model: export.MODEL_IDENTITY) is refused in one
line."""
import asyncio
import concurrent.futures
import os
import shutil
import time

from .. import checkpoint
from .bundle import Bundle
from .export import another_model, consistent_version, export

LOOK_EVERY_S = 0.05
RETRY_AFTER_S = 0.5   # a version whose export failed is tried again after this, or once a newer one comes


def appeared_at(checkpoint_dir):
    """When the checkpoint's newest part (the full checkpoint or its last delta) was put in place:
    the latest change time of its folder and of its deltas' (a rename changes it), or of the
    meta.json written just before the rename, whichever is later."""
    folder, _ = checkpoint.locate(checkpoint_dir)
    parts = [folder]
    deltas = os.path.join(folder, checkpoint.DELTAS)
    if os.path.isdir(deltas):
        parts += [os.path.join(deltas, name) for name in os.listdir(deltas) if not name.startswith(".")]
    times = []
    for part in parts:
        for path in (part, os.path.join(part, checkpoint.META)):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            times.append(max(st.st_ctime, st.st_mtime))
    return max(times)


class CheckpointWatcher:
    """Follows `checkpoint_dir`, exporting each new version under `work_dir`, opening it with
    `open_bundle` (a path -> a Bundle) and swapping it into `served` (a ServedBundle); `log`
    prints a line."""

    def __init__(self, checkpoint_dir, served, work_dir, log, open_bundle=Bundle.open):
        self.checkpoint_dir, self.served, self.work_dir, self.log = checkpoint_dir, served, work_dir, log
        self.open_bundle = open_bundle
        # Exports run beside the model's thread, not in it: serving goes on meanwhile.
        self._export_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hetu-serve-export")
        self._failed_version = None   # the version whose export failed last (said once) ...
        self._retry_at = 0.0          # ... and when to try it again
        self._exports = 0
        self._broken = None           # the last break of the chain of deltas said

    async def run(self):
        while True:
            await asyncio.sleep(LOOK_EVERY_S)
            await self.look()

    async def look(self):
        """One look at the folder: export and swap in a newer version if there is one."""
        loop = asyncio.get_running_loop()
        try:
            version, broken = await loop.run_in_executor(self._export_thread, consistent_version,
                                                         self.checkpoint_dir)
        except (OSError, ValueError):
            return   # none yet, or a full checkpoint being swapped in: the next look sees it
        if broken != self._broken:
            self._broken = broken
            if broken is not None:
                self.log(f"{broken}: serving no version past it (the last before it: {version})")
        if self.served.bundle is not None and version <= self.served.bundle.version:
            return   # (none served yet: the server waits for the first checkpoint)
        if version == self._failed_version and time.monotonic() < self._retry_at:
            return   # one that cannot be served (another model, an op without ONNX) waits its turn
        try:
            bundle, folder, appeared = await loop.run_in_executor(self._export_thread, self._export, version)
        except Exception as e:   # noqa: BLE001 - the next look tries again
            self._failed(version, f"its export failed ({type(e).__name__}: {e}); trying again")
            return
        served = self.served.bundle
        other = None
        if served is None:
            pass   # the first version of a server started without a bundle: whichever model it is
        elif bundle.name != served.name:
            other = f"it is a model {bundle.name}, this server serves {served.name}"
        elif "run" in bundle.schema and "run" in served.schema:
            differs = another_model(bundle.schema["run"], served.schema["run"])
            if differs:
                other = f"it is another model than the one served, trained with {differs}"
        if other:
            self._failed(version, other)
        if served is not None and bundle.version <= served.version or other:
            await loop.run_in_executor(self._export_thread, shutil.rmtree, folder, True)
            return
        self.served.swap(bundle, folder)
        self.log(f"serving version {bundle.version}, {time.time() - appeared:.3f} s after its checkpoint "
                 f"appeared")

    def _failed(self, version, why):
        if version != self._failed_version:
            self.log(f"version {version} of {self.checkpoint_dir} not served: {why}")
        self._failed_version, self._retry_at = version, time.monotonic() + RETRY_AFTER_S

    def _export(self, version):
        appeared = appeared_at(self.checkpoint_dir)
        self._exports += 1
        folder = os.path.join(self.work_dir, f"version-{version}.{self._exports}")
        try:
            # The job may replace the checkpoint while it is read: export reads it again then.
            path = export(self.checkpoint_dir, folder, consistent=True)
            return self.open_bundle(path), folder, appeared
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def close(self):
        self._export_thread.shutdown(wait=True)
