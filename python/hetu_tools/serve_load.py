"""Requests for the serving endpoint (python -m hetu.serve run), shared by its tests and
bench/serve.py: raw instances drawn for a bundle's columns, and a client that sends them and
records every answer (its version, its latency) or failure."""
import asyncio
import json
import time

import numpy as np

ID_RANGE = 1000   # field-local ids drawn below this, and below the field's size where it has one


def random_instances(bundle, count, seed=0):
    """`count` raw instances {column: value} for a Bundle's columns (its schema's: name, kind
    dense / categorical / bag, and value id / text / number / integer)."""
    columns, fields = bundle.schema["columns"], bundle.schema["fields"]
    rng = np.random.default_rng(seed)

    def raw(column):
        if column["kind"] == "dense":
            return int(rng.integers(0, 100)) if column.get("value") == "integer" else round(float(rng.random()), 6)
        if column.get("value") == "id":
            ids = min(ID_RANGE, fields[column["field"]].get("size", ID_RANGE))
            draw = lambda: int(rng.integers(0, ids))   # noqa: E731
        else:
            draw = lambda: f"{int(rng.integers(0, 1 << 20)):08x}"   # noqa: E731
        if column["kind"] == "bag":
            return [draw() for _ in range(int(rng.integers(1, max(2, column.get("slots", 2)) + 1)))]
        return draw()

    return [{column["name"]: raw(column) for column in columns} for _ in range(count)]


class Answer:
    __slots__ = ("status", "version", "predictions", "error", "sent", "received", "at")

    def __init__(self, status, body, sent, received):
        self.status, self.sent, self.received = status, sent, received
        self.at = time.time()   # wall clock, to compare with a file's change time
        self.version = body.get("model_version") if isinstance(body, dict) else None
        self.predictions = body.get("predictions") if isinstance(body, dict) else None
        self.error = body.get("error") if isinstance(body, dict) else body

    @property
    def ok(self):
        return self.status == 200 and self.version is not None and self.predictions is not None

    @property
    def latency(self):
        return self.received - self.sent


async def predict(session, url, instances):
    """One request; an Answer (a failed connection is status 0, its error the exception)."""
    payload = json.dumps({"instances": instances})
    sent = time.perf_counter()
    try:
        async with session.post(url, data=payload, headers={"Content-Type": "application/json"}) as response:
            text = await response.text()
            status = response.status
    except Exception as e:   # noqa: BLE001 - a failure to count, not to raise
        return Answer(0, f"{type(e).__name__}: {e}", sent, time.perf_counter())
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = text
    return Answer(status, body, sent, time.perf_counter())


async def clients(url, batches, count, stop_when, pause=0.0):
    """`count` clients, each sending batches[i % len(batches)] one request after another until
    stop_when() is true; the answers of each client, in its order."""
    import aiohttp
    answers = [[] for _ in range(count)]

    async def client(k, session):
        i = k
        while not stop_when():
            answers[k].append(await predict(session, url, batches[i % len(batches)]))
            i += count
            if pause:
                await asyncio.sleep(pause)

    connector = aiohttp.TCPConnector(limit=count)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(k, session) for k in range(count)))
    return answers


def percentile_ms(latencies, q):
    return float(np.percentile(np.asarray(latencies), q) * 1e3) if len(latencies) else float("nan")
