"""The serving endpoint, `python -m hetu.serve run BUNDLE --port P`: TensorFlow Serving's REST API
on aiohttp (hetu.serve.rest: its URLs, request forms and errors).

    GET  /v1/models/NAME[/versions/V|/labels/L]            -> {"model_version_status": [{"version": "V", ...}]}
    GET  /v1/models/NAME[/versions/V|/labels/L]/metadata   -> {"model_spec": ..., "metadata": {"signature_def": ...}}
    POST /v1/models/NAME[/versions/V|/labels/L]:predict    {"instances": [{column: raw value, ...}, ...]}
                                   -> {"predictions": [p, ...], "model_version": V}
                                   or {"inputs": {column: [raw value, ...], ...}} -> {"outputs": [p, ...], ...}
                                   a sequential model's: {"instances": [{"history": [item, ...],
                                   "timestamps": [...], "k": K}, ...]} -> {"predictions":
                                   [{"items": [...], "scores": [...]}, ...], ...} (hetu.serve.sequences)
    GET  /v1/models/NAME/stats     -> the batching counters, the swaps, the ids the model never saw
    GET  /monitoring/prometheus/metrics -> the same and the requests, in Prometheus' text format (metrics.py)

Concurrent requests are batched (batching.py); with --watch the server follows a training job's
checkpoint folder and swaps in each new version (watch.py); without BUNDLE it listens at once, every
model 404 as TensorFlow Serving answers one with no version loaded, and serves the folder's first
checkpoint once it lands. A bad request gets
{"error": "<one line>"} with TensorFlow Serving's status (400 for a malformed one, 404 for another
model or version, 413 for a body over --max-body-bytes) and the server goes on serving. A startup
error (the bundle, the port) exits 2 with one line; SIGTERM and SIGINT stop it cleanly: it stops
listening, answers the requests it has, exits 0.
"""
import argparse
import asyncio
import functools
import gc
import json
import re
import signal
import sys
import tempfile
import traceback

from aiohttp import web

from . import rest
from .batching import DEFAULT_MAX_INSTANCES, Batcher, ServedBundle
from .bundle import Bundle, InstanceError

PROG = "python -m hetu.serve run"
DEFAULT_MAX_BODY_BYTES = 64 << 20
# A body larger than this is parsed (in pieces: rest.parse_in_pieces), and its instances read, on
# a thread: a 60 MB body takes seconds, which on the event loop, or in one call holding the
# interpreter's lock, would hold up every other client's request.
PARSE_ON_LOOP_BYTES = 1 << 20


def log(line):
    print(line, flush=True)


def one_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def error(status, message):
    return web.json_response({"error": message}, status=status)


@web.middleware
async def json_errors(request, handler):
    """Every error as {"error": one line}: aiohttp's own (no route, a wrong method, a body too
    large) included, and a failure of the server itself as 500, its traceback on stderr."""
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app["max_body_bytes"]
        return error(413, f"the request body is larger than the server's limit of {limit} bytes (--max-body-bytes)")
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error(e.status, f"{request.method} {request.path}: {e.reason}")
    except Exception as e:   # noqa: BLE001 - the server keeps serving
        traceback.print_exc()
        return error(500, f"the server failed on this request: {type(e).__name__}: {one_line(e)}")


class Endpoint:
    """TensorFlow Serving's REST API (hetu.serve.rest) over one ServedBundle and its Batcher: every
    /v1 path comes to dispatch, which answers it or says what is malformed, as TensorFlow Serving
    does. `labels` name the served version (/labels/L); `lenient` keeps unknown columns and empty
    "instances" as the server took them before it was strict."""

    def __init__(self, served, batcher, labels=rest.DEFAULT_LABELS, lenient=False):
        self.served, self.batcher = served, batcher
        self.labels, self.lenient = frozenset(labels), lenient
        self._signature = (None, None)   # (the bundle, its signature), found once per bundle served

    async def dispatch(self, request):
        path = request.rel_url.raw_path
        request["api"] = "other"   # for the metrics: the API asked, once the path names one
        if request.method == "OPTIONS" and rest.API.fullmatch(path):   # a CORS preflight, as TensorFlow Serving
            if re.search(r"https?://", request.headers.get("Origin", "")):
                return web.Response(content_type="application/json")
            return error(400, "Origin header is missing in CORS preflight")
        try:
            asked = rest.route(request.method, path)
            if asked is None:
                raise web.HTTPNotFound()
            request["api"] = asked.action
            return await getattr(self, asked.action)(request, asked)
        except rest.RestError as e:
            return error(e.status, e.message)

    async def status(self, request, asked):
        bundle = self.served.bundle
        rest.resolve(asked, bundle, self.labels)
        return web.json_response(rest.status(bundle))

    async def metadata(self, request, asked):
        bundle = self.served.bundle
        rest.resolve(asked, bundle, self.labels)
        return web.json_response(rest.metadata(bundle))

    async def stats(self, request, asked):
        rest.resolve(asked, self.served.bundle, self.labels)
        counters = {key: self.batcher.stats[key] for key in
                    ("requests", "instances", "batches", "largest_batch", "failed_batches")}
        unknown = {}
        for (column, where), count in sorted(self.batcher.unknown.items()):
            unknown.setdefault(column, {})[where] = count
        return web.json_response({**counters, "version": self.served.bundle.version, "swaps": self.served.swaps,
                                  "max_batch": self.batcher.max_batch, "max_wait_ms": self.batcher.max_wait * 1e3,
                                  "unknown_ids": unknown})

    async def document(self, request):
        """(the request's body: a JSON object, read within --max-body-bytes; whether its text may
        hold a {"b64": ...} value, which rows without one are not searched for; its bytes)."""
        limit = request.app["max_body_bytes"]
        if request.content_length is not None and request.content_length > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
        body = await request.read()
        try:
            document = json.loads(body) if len(body) <= PARSE_ON_LOOP_BYTES else \
                await asyncio.get_running_loop().run_in_executor(None, rest.parse_in_pieces, body)
        except ValueError as e:   # not UTF-8, not JSON, or an integer of more digits than Python reads
            raise rest.RestError(400, f"the request body is not JSON: {one_line(e)}") from None
        except RecursionError:
            raise rest.RestError(400, "the request body nests its JSON deeper than the server reads") from None
        if not isinstance(document, dict):
            raise rest.RestError(400, 'the request body is not a JSON object: {"instances": [{column: raw value, '
                                      '...}, ...]} or {"inputs": {column: [value, ...], ...}}')
        return document, b"b64" in body or b"\\u" in body, len(body)   # "b64" itself, or written in escapes

    async def predict(self, request, asked):
        # In TensorFlow Serving's order: the body, its signature's name, the model, then its inputs.
        document, b64, size = await self.document(request)
        name = rest.signature_name(document)
        bundle = self.served.bundle
        rest.resolve(asked, bundle, self.labels)
        rest.check_predict_signature(name)
        if self._signature[0] is not bundle:
            self._signature = (bundle, rest.signature(bundle))
        signature = self._signature[1]
        read = functools.partial(rest.instances_of, document, signature, self.lenient, b64)
        instances, columnar = read() if size <= PARSE_ON_LOOP_BYTES else \
            await asyncio.get_running_loop().run_in_executor(None, read)
        try:
            predictions, version = await self.batcher.predict(instances)
        except InstanceError as e:
            return error(400, one_line(e))
        if asked.version is not None and version != asked.version:
            raise rest.not_found(asked)   # the version asked for was swapped out while the request waited
        return web.json_response(rest.answer(predictions, columnar, signature, version))

    async def classify(self, request, asked):
        """:classify and :regress: a bundle has no such signature, which TensorFlow Serving answers
        with 400 once the body's "examples" and the model are found."""
        document, _, _ = await self.document(request)
        name = rest.signature_name(document)
        rest.check_examples(document, asked.action)
        rest.resolve(asked, self.served.bundle, self.labels)
        raise rest.no_signature_for(asked.action, name)

    regress = classify


def prometheus(served, batcher):
    """(the Metrics of this server or None without prometheus_client, the handler of its path)."""
    try:
        from .metrics import Metrics
    except ImportError as e:
        why = f"no metrics: {one_line(e)} (pip install prometheus_client)"

        async def absent(request):
            return error(503, why)
        return None, absent
    metrics = Metrics(served, batcher)

    async def scrape(request):
        return web.Response(body=metrics.text(), headers={"Content-Type": metrics.content_type})
    return metrics, scrape


def make_app(served, batcher, max_body_bytes, labels=rest.DEFAULT_LABELS, lenient=False):
    metrics, scrape = prometheus(served, batcher)
    app = web.Application(middlewares=([metrics.middleware()] if metrics else []) + [json_errors],
                          client_max_size=max_body_bytes)
    app["max_body_bytes"] = max_body_bytes
    endpoint = Endpoint(served, batcher, labels, lenient)
    app.router.add_get("/monitoring/prometheus/metrics", scrape)
    app.router.add_route("*", "/{path:.*}", endpoint.dispatch)
    return app


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description="Serve a bundle's predictions over HTTP "
                                "(TensorFlow Serving's REST form).")
    p.add_argument("bundle", metavar="BUNDLE", nargs="?", default=None,
                   help="a bundle folder (python -m hetu.serve export); optional with --watch, whose first "
                        "checkpoint is then served once it lands (until then every model is 404, no version)")
    p.add_argument("--port", type=int, required=True, help="the port to listen on (0: any free one, printed)")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    p.add_argument("--max-batch", type=int, default=256, metavar="N",
                   help="the most instances merged into one model run (default 256)")
    p.add_argument("--max-wait-ms", type=float, default=0.0, metavar="T",
                   help="how long a batch waits for more requests after its first one (default 0: it takes "
                        "those waiting, which gather while the batch before runs)")
    p.add_argument("--max-instances", type=int, default=DEFAULT_MAX_INSTANCES, metavar="N",
                   help="the most instances one request may carry; more get 400 (default "
                        f"{DEFAULT_MAX_INSTANCES}); a request larger than --max-batch runs in parts between the others")
    p.add_argument("--model-threads", type=int, default=1, metavar="N",
                   help="ONNX Runtime's threads for the dense part (default 1: the event loop keeps a core)")
    p.add_argument("--watch", metavar="CHECKPOINT_DIR", default=None,
                   help="follow a training job's checkpoint folder: serve each new full checkpoint or delta")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, metavar="B",
                   help=f"the largest request body accepted; larger ones get 413 (default {DEFAULT_MAX_BODY_BYTES})")
    p.add_argument("--version-label", action="append", default=None, metavar="LABEL", dest="labels",
                   help="a label naming the served version, for /v1/models/NAME/labels/LABEL (repeatable; default: "
                        + ", ".join(rest.DEFAULT_LABELS) + ")")
    p.add_argument("--lenient", action="store_true",
                   help="ignore an instance's columns the model does not read and answer empty \"instances\" "
                        "(TensorFlow Serving refuses both with 400)")
    args = p.parse_args(argv)
    if args.bundle is None and args.watch is None:
        p.error("BUNDLE is required, unless --watch names a training job's checkpoint folder to serve from")
    for flag, value in (("--max-batch", args.max_batch), ("--max-body-bytes", args.max_body_bytes),
                        ("--max-instances", args.max_instances),
                        ("--model-threads", args.model_threads)):
        if value < 1:
            p.error(f"{flag} must be at least 1, not {value}")
    if args.max_wait_ms < 0:
        p.error(f"--max-wait-ms must not be negative, not {args.max_wait_ms}")
    return args


def fail(message):
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return 2


async def serve(args, bundle):
    """Runs the server until SIGTERM or SIGINT; returns the exit status."""
    loop = asyncio.get_running_loop()
    served = ServedBundle(bundle)
    batcher = Batcher(served, args.max_batch, args.max_wait_ms / 1e3, args.max_instances)
    app = make_app(served, batcher, args.max_body_bytes, args.labels or rest.DEFAULT_LABELS, args.lenient)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        return fail(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}")
    port = runner.addresses[0][1]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(batcher.run(), name="batcher")]
    watcher, work_dir = None, None
    if args.watch:
        from .watch import CheckpointWatcher   # export's dependencies only where a checkpoint is followed
        work_dir = tempfile.TemporaryDirectory(prefix="hetu-serve-")
        watcher = CheckpointWatcher(args.watch, served, work_dir.name, log,
                                    open_bundle=functools.partial(Bundle.open, threads=args.model_threads))
        tasks.append(asyncio.create_task(watcher.run(), name="watcher"))
    # What was loaded at start (modules, the bundle) stays: the collector's full passes skip it,
    # which keeps them short beside the requests.
    gc.freeze()
    if bundle is None:
        log(f"waiting for the first checkpoint in {args.watch} to serve it at http://{args.host}:{port}/v1/models/")
    else:
        log(f"serving {bundle.name} version {bundle.version} at http://{args.host}:{port}/v1/models/{bundle.name}"
            + (f", following {args.watch}" if args.watch else ""))
    await stop.wait()
    log("stopping: answering the requests received")
    await runner.cleanup()   # stops listening, waits for the handlers running
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    batcher.close()
    if watcher is not None:
        watcher.close()
    served.close()
    if work_dir is not None:
        work_dir.cleanup()
    log("stopped")
    return 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.bundle is None:
        return asyncio.run(serve(args, None))
    try:
        bundle = Bundle.open(args.bundle, threads=args.model_threads)
    except Exception as e:   # noqa: BLE001 - any reason the bundle cannot be served, in one line
        return fail(f"cannot open the bundle {args.bundle}: {one_line(e)}")
    return asyncio.run(serve(args, bundle))
