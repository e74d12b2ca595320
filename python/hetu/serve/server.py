"""The serving endpoint, `python -m hetu.serve run BUNDLE --port P`: TensorFlow Serving's REST form
on aiohttp.

    POST /v1/models/NAME:predict   {"instances": [{column: raw value, ...}, ...]}
                                   -> {"predictions": [p, ...], "model_version": V}
                                   a sequential model's: {"instances": [{"history": [item, ...],
                                   "timestamps": [...], "k": K}, ...]} -> {"predictions":
                                   [{"items": [...], "scores": [...]}, ...], ...} (hetu.serve.sequences)
    GET  /v1/models/NAME           -> {"model_version_status": [{"version": "V", "state": "AVAILABLE", ...}]}
    GET  /v1/models/NAME/stats     -> the batching counters and the swaps

Concurrent requests are batched (batching.py); with --watch the server follows a training job's
checkpoint folder and swaps in each new version (watch.py). A bad request gets
{"error": "<one line>"} with 400 (413 for a body over --max-body-bytes, 404 for an unknown model
or path) and the server goes on serving. A startup error (the bundle, the port) exits 2 with one
line; SIGTERM and SIGINT stop it cleanly: it stops listening, answers the requests it has, exits 0.
"""
import argparse
import asyncio
import functools
import gc
import json
import signal
import sys
import tempfile
import traceback

from aiohttp import web

from .batching import DEFAULT_MAX_INSTANCES, Batcher, ServedBundle
from .bundle import Bundle, InstanceError

PROG = "python -m hetu.serve run"
DEFAULT_MAX_BODY_BYTES = 64 << 20


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
    """The routes' handlers over one ServedBundle and its Batcher."""

    def __init__(self, served, batcher):
        self.served, self.batcher = served, batcher

    def _unknown_model(self, name):
        known = self.served.bundle.name
        if name == known:
            return None
        return error(404, f"no model named {name!r}: this server serves {known!r}")

    async def status(self, request):
        unknown = self._unknown_model(request.match_info["name"])
        if unknown:
            return unknown
        return web.json_response({"model_version_status": [{
            "version": str(self.served.bundle.version), "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""}}]})

    async def stats(self, request):
        unknown = self._unknown_model(request.match_info["name"])
        if unknown:
            return unknown
        counters = {key: self.batcher.stats[key] for key in
                    ("requests", "instances", "batches", "largest_batch", "failed_batches")}
        return web.json_response({**counters, "version": self.served.bundle.version, "swaps": self.served.swaps,
                                  "max_batch": self.batcher.max_batch, "max_wait_ms": self.batcher.max_wait * 1e3})

    async def predict(self, request):
        unknown = self._unknown_model(request.match_info["name"])
        if unknown:
            return unknown
        limit = request.app["max_body_bytes"]
        if request.content_length is not None and request.content_length > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
        body = await request.read()
        try:
            document = json.loads(body)
        except ValueError as e:   # not UTF-8, not JSON, or an integer of more digits than Python reads
            return error(400, f"the request body is not JSON: {one_line(e)}")
        except RecursionError:
            return error(400, "the request body nests its JSON deeper than the server reads")
        instances = document.get("instances") if isinstance(document, dict) else None
        if not isinstance(instances, list):
            return error(400, 'the request body needs "instances": a list of objects, {column: raw value, ...}')
        for i, instance in enumerate(instances):
            if not isinstance(instance, dict):
                return error(400, f"instance {i} is a JSON {type(instance).__name__}, not an object "
                                  f"{{column: raw value, ...}}")
        try:
            predictions, version = await self.batcher.predict(instances)
        except InstanceError as e:
            return error(400, one_line(e))
        # A CTR bundle answers an array of probabilities, a sequential model's a list of top items.
        predictions = predictions.tolist() if hasattr(predictions, "tolist") else predictions
        return web.json_response({"predictions": predictions, "model_version": version})


def make_app(served, batcher, max_body_bytes):
    app = web.Application(middlewares=[json_errors], client_max_size=max_body_bytes)
    app["max_body_bytes"] = max_body_bytes
    endpoint = Endpoint(served, batcher)
    app.router.add_post("/v1/models/{name}:predict", endpoint.predict)
    app.router.add_get("/v1/models/{name}/stats", endpoint.stats)
    app.router.add_get("/v1/models/{name}", endpoint.status)
    return app


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description="Serve a bundle's predictions over HTTP "
                                "(TensorFlow Serving's REST form).")
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle folder (python -m hetu.serve export)")
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
    args = p.parse_args(argv)
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
    runner = web.AppRunner(make_app(served, batcher, args.max_body_bytes), access_log=None)
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
    try:
        bundle = Bundle.open(args.bundle, threads=args.model_threads)
    except Exception as e:   # noqa: BLE001 - any reason the bundle cannot be served, in one line
        return fail(f"cannot open the bundle {args.bundle}: {one_line(e)}")
    return asyncio.run(serve(args, bundle))
