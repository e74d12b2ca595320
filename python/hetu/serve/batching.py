"""Request batching for the serving endpoint: concurrent requests are merged into one
Bundle.predict call of at most `max_batch` instances, gathered for at most `max_wait` seconds
after the first one arrives. The model runs in a thread of its own, so the event loop keeps
accepting requests meanwhile; those that arrive while a batch runs form the next one.

A batch is answered wholly by one Bundle (the one the slot serves when the batch starts, leased
until it ends), so no response mixes two versions."""
import asyncio
import collections
import concurrent.futures
import contextlib
import shutil

from .bundle import InstanceError


class ServedBundle:
    """The Bundle that answers, swapped whole. Each batch leases the bundle it runs on; a bundle
    swapped out is retired (its folder removed, where the server exported it) once no batch uses it.
    Used on the event loop's thread only."""

    def __init__(self, bundle, folder=None):
        self._leases = collections.Counter()   # id(bundle) -> batches running on it
        self._retiring = {}                    # id(bundle) -> (bundle, folder) swapped out, still leased
        self._bundle, self._folder = bundle, folder
        self.swaps = 0

    @property
    def bundle(self):
        return self._bundle

    @contextlib.contextmanager
    def lease(self):
        bundle = self._bundle
        self._leases[id(bundle)] += 1
        try:
            yield bundle
        finally:
            self._leases[id(bundle)] -= 1
            if not self._leases[id(bundle)]:
                del self._leases[id(bundle)]
                if id(bundle) in self._retiring:
                    self._retire(*self._retiring.pop(id(bundle)))

    def swap(self, bundle, folder):
        """Serve `bundle` (exported into `folder`, removed once it is retired) from the next batch on."""
        old, old_folder = self._bundle, self._folder
        self._bundle, self._folder = bundle, folder
        self.swaps += 1
        if self._leases[id(old)]:
            self._retiring[id(old)] = (old, old_folder)
        else:
            del self._leases[id(old)]
            self._retire(old, old_folder)

    def close(self):
        """At shutdown, once no batch runs: the folders the server exported are removed."""
        for bundle, folder in [*self._retiring.values(), (self._bundle, self._folder)]:
            self._retire(bundle, folder)
        self._retiring.clear()

    @staticmethod
    def _retire(bundle, folder):
        close = getattr(bundle, "close", None)
        if close is not None:
            close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


class Request:
    __slots__ = ("instances", "answer")

    def __init__(self, instances, answer):
        self.instances, self.answer = instances, answer


class Batcher:
    """predict(instances) -> (probabilities, version), answered from a merged batch."""

    def __init__(self, served, max_batch, max_wait):
        self.served = served
        self.max_batch, self.max_wait = max_batch, max_wait
        self._waiting = collections.deque()
        self._waiting_instances = 0
        self._arrived = asyncio.Event()
        # One thread runs the model: batches run one at a time, ONNX Runtime's own threads inside.
        self._model_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hetu-serve-model")
        self.stats = collections.Counter()   # batches, requests, instances, largest_batch, failed_batches

    async def predict(self, instances):
        answer = asyncio.get_running_loop().create_future()
        self._waiting.append(Request(instances, answer))
        self._waiting_instances += len(instances)
        self._arrived.set()
        return await answer

    async def run(self):
        """The batching loop (a task of the server's event loop)."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._waiting:
                self._arrived.clear()
                await self._arrived.wait()
            deadline = loop.time() + self.max_wait
            while self._waiting_instances < self.max_batch and loop.time() < deadline:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
                except asyncio.TimeoutError:
                    break
            await self._run_batch(self._take_batch())

    def _take_batch(self):
        """The waiting requests, in arrival order, up to max_batch instances (at least one request:
        one larger than max_batch runs alone, whole, so that one version answers it)."""
        batch, size = [], 0
        while self._waiting and (not batch or size + len(self._waiting[0].instances) <= self.max_batch):
            request = self._waiting.popleft()
            batch.append(request)
            size += len(request.instances)
        self._waiting_instances -= size
        return batch

    async def _run_batch(self, batch):
        loop = asyncio.get_running_loop()
        instances = [instance for request in batch for instance in request.instances]
        self.stats.update(batches=1, requests=len(batch), instances=len(instances))
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(instances))
        with self.served.lease() as bundle:
            try:
                probabilities = await loop.run_in_executor(self._model_thread, bundle.predict, instances)
            except InstanceError as e:
                if len(batch) == 1:
                    return _answer(batch[0], exception=e)
                # A bad instance fails the merged call: each request again on its own, so that
                # only the bad one fails and its error counts the instances from its own first one.
                for request in batch:
                    try:
                        alone = await loop.run_in_executor(self._model_thread, bundle.predict, request.instances)
                    except Exception as e:   # noqa: BLE001 - handed to the request's handler
                        _answer(request, exception=e)
                    else:
                        _answer(request, result=(alone, bundle.version))
                return
            except Exception as e:   # noqa: BLE001 - handed to every request's handler
                self.stats["failed_batches"] += 1
                for request in batch:
                    _answer(request, exception=e)
                return
        start = 0
        for request in batch:
            end = start + len(request.instances)
            _answer(request, result=(probabilities[start:end], bundle.version))
            start = end

    def close(self):
        self._model_thread.shutdown(wait=True)
        for request in self._waiting:
            _answer(request, exception=RuntimeError("the server is shutting down"))
        self._waiting.clear()


def _answer(request, result=None, exception=None):
    # A request whose client went away has been cancelled: nothing to answer.
    if request.answer.done():
        return
    if exception is not None:
        request.answer.set_exception(exception)
    else:
        request.answer.set_result(result)
