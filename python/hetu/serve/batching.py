"""Request batching for the serving endpoint: concurrent requests are merged into one
Bundle.predict call of at most `max_batch` instances, gathered for at most `max_wait` seconds
after the first one arrives. The model runs in a thread of its own, so the event loop keeps
accepting requests meanwhile; those that arrive while a batch runs form the next one. A request
larger than `max_batch` runs in parts of at most `max_batch`, the other requests' batches between
them; one of more than `max_instances` is refused.

A request is answered wholly by one Bundle (the one the slot serves when its first instances
start, leased until it is answered), so no response mixes two versions."""
import asyncio
import collections
import concurrent.futures
import re
import shutil

import numpy as np

from .bundle import InstanceError

# The most instances one request may carry: about 110 MB of Python objects for Criteo's 39 columns
# and a few seconds of one core's model time, far above a ranking request's few thousand candidates.
DEFAULT_MAX_INSTANCES = 16384


class TooManyInstances(InstanceError):
    """A request of more instances than the server takes (--max-instances): TensorFlow Serving
    refuses a request over its largest batch as an invalid argument, 400."""


class ServedBundle:
    """The Bundle that answers, swapped whole (None until the first, where --watch starts without one). Each batch leases the bundle it runs on; a bundle
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

    def acquire(self):
        """The bundle served now, leased until release(bundle)."""
        bundle = self._bundle
        self._leases[id(bundle)] += 1
        return bundle

    def release(self, bundle):
        self._leases[id(bundle)] -= 1
        if not self._leases[id(bundle)]:
            del self._leases[id(bundle)]
            if id(bundle) in self._retiring:
                self._retire(*self._retiring.pop(id(bundle)))

    def swap(self, bundle, folder):
        """Serve `bundle` (exported into `folder`, removed once it is retired) from the next batch on
        (the first one, where the server started without a bundle)."""
        old, old_folder = self._bundle, self._folder
        self._bundle, self._folder = bundle, folder
        self.swaps += 1
        if old is None:
            return
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
    """A request's instances, the parts of them given to batches so far and their predictions, and
    the bundle that answers it (leased from its first part until it is answered)."""
    __slots__ = ("instances", "answer", "taken", "predictions", "answered", "bundle")

    def __init__(self, instances, answer):
        self.instances, self.answer = instances, answer
        self.taken = self.answered = 0
        self.predictions = []
        self.bundle = None

    @property
    def left(self):
        return len(self.instances) - self.taken


class Batcher:
    """predict(instances) -> (probabilities, version), answered from merged batches."""

    def __init__(self, served, max_batch, max_wait, max_instances=DEFAULT_MAX_INSTANCES):
        self.served = served
        self.max_batch, self.max_wait, self.max_instances = max_batch, max_wait, max_instances
        self._waiting = collections.deque()
        self._waiting_instances = 0
        self._arrived = asyncio.Event()
        # One thread runs the model: batches run one at a time, ONNX Runtime's own threads inside.
        self._model_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hetu-serve-model")
        self.stats = collections.Counter()   # batches, requests, instances, largest_batch, failed_batches
        self.batch_sizes = collections.Counter()   # instances in a model run -> runs of that many
        # (raw column, where) -> ids the model never saw (Bundle.predict's `unknown`), over every version served
        self.unknown = collections.Counter()

    async def predict(self, instances):
        if len(instances) > self.max_instances:
            raise TooManyInstances(f"the request has {len(instances)} instances, more than the server's limit of "
                                   f"{self.max_instances} (--max-instances): send them in several requests")
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
            parts = self._take_batch()
            if parts:
                await self._run_batch(parts)

    def _take_batch(self):
        """Parts (request, start, end) of the waiting requests, in arrival order, up to max_batch
        instances, all answered by one bundle: the one its first request is leased to, else the one
        served now. A request that fits is taken whole; one larger than max_batch gives a part
        filling the batch and goes to the back of the queue with the rest, so that the requests
        after it are not held up behind it. A request leased to another bundle waits its turn."""
        parts, size, bundle, skipped, rest = [], 0, None, [], None
        while self._waiting and size < self.max_batch:
            request = self._waiting[0]
            if request.answer.done():   # failed in an earlier part, or its client went away
                self._waiting.popleft()
                self._waiting_instances -= request.left
                self._finish(request)
                continue
            if bundle is None:
                bundle = request.bundle or self.served.bundle
            if (request.bundle or self.served.bundle) is not bundle:
                skipped.append(self._waiting.popleft())
                continue
            take = request.left
            if size + take > self.max_batch:
                if take <= self.max_batch and parts:
                    break   # it fits the next batch whole
                take = self.max_batch - size
            self._waiting.popleft()
            if request.bundle is None:
                request.bundle = self.served.acquire()
                self.stats["requests"] += 1
            parts.append((request, request.taken, request.taken + take))
            request.taken += take
            size += take
            self._waiting_instances -= take
            if request.left:
                rest = request
        self._waiting.extendleft(reversed(skipped))
        if rest is not None:
            self._waiting.append(rest)
        return parts

    async def _run_batch(self, parts):
        bundle = parts[0][0].bundle
        instances = [instance for request, start, end in parts for instance in request.instances[start:end]]
        self.stats.update(batches=1, instances=len(instances))
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(instances))
        self.batch_sizes[len(instances)] += 1
        try:
            predictions = await self._predict(bundle, instances)
        except Exception as e:   # noqa: BLE001 - handed to the requests' handlers
            if not isinstance(e, InstanceError):
                self.stats["failed_batches"] += 1
            if len(parts) == 1:
                return self._fail(parts[0][0], _from(e, parts[0][1]))
            # One bad instance fails the merged call: each part again on its own, so that only
            # the bad request fails and its error counts the instances from its own first one.
            for request, start, end in parts:
                try:
                    alone = await self._predict(bundle, request.instances[start:end])
                except Exception as e:   # noqa: BLE001 - handed to the request's handler
                    self._fail(request, _from(e, start))
                else:
                    self._answered(request, alone)
            return
        at = 0
        for request, start, end in parts:
            self._answered(request, predictions[at:at + end - start])
            at += end - start

    async def _predict(self, bundle, instances):
        """bundle.predict(instances) in the model's thread; the unknown ids of a run that succeeds
        are counted (counted in a Counter of the run's own, added here on the loop's thread)."""
        loop = asyncio.get_running_loop()
        if not getattr(bundle, "counts_unknown", False):
            return await loop.run_in_executor(self._model_thread, bundle.predict, instances)
        unknown = collections.Counter()
        predictions = await loop.run_in_executor(self._model_thread, bundle.predict, instances, unknown)
        self.unknown.update(unknown)
        return predictions

    def _answered(self, request, predictions):
        """One part of `request` answered: the request is once all its parts are."""
        request.predictions.append(predictions)
        request.answered += len(predictions)
        if request.answered < len(request.instances):
            return
        parts = request.predictions
        if len(parts) == 1:
            whole = parts[0]
        elif all(isinstance(p, np.ndarray) for p in parts):
            whole = np.concatenate(parts)
        else:
            whole = [p for part in parts for p in part]
        _answer(request, result=(whole, request.bundle.version))
        self._finish(request)

    def _fail(self, request, exception):
        _answer(request, exception=exception)
        if not request.left:   # else its queued rest is dropped (and its lease released) when reached
            self._finish(request)

    def _finish(self, request):
        if request.bundle is not None:
            self.served.release(request.bundle)
            request.bundle = None

    def close(self):
        self._model_thread.shutdown(wait=True)
        for request in self._waiting:
            _answer(request, exception=RuntimeError("the server is shutting down"))
            self._finish(request)
        self._waiting.clear()


def _from(exception, start):
    """`exception` of a request's part starting at instance `start`: an InstanceError's index
    counted from the request's first instance."""
    if not start or not isinstance(exception, InstanceError):
        return exception
    shifted = re.sub(r"^instance (\d+)", lambda m: f"instance {int(m.group(1)) + start}", str(exception), count=1)
    return type(exception)(shifted)


def _answer(request, result=None, exception=None):
    # A request whose client went away has been cancelled: nothing to answer.
    if request.answer.done():
        return
    if exception is not None:
        request.answer.set_exception(exception)
    else:
        request.answer.set_result(result)
