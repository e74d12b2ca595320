"""What an eavesdropper on the job's network records commands nothing (ps-lite/README.md, Security).

A sniffer on loopback records every TCP byte of two jobs that share a secret (as a job started by
hand with the same HETU_JOB_SECRET would). While the second job's workers stand half way, an
outsider replays, each on a new connection of its own, messages recorded on the wire: the
second job's own kClear, kSave and kLoad (worker 0 sent them at its start), the first job's
kClear, kSave and its workers' kExit, and a kNodeDead in the scheduler's name, written behind a
credential recorded from the scheduler's own connection (ZMQ: the PLAIN password and a
message's tag; UCX: a message's head). Every one must be refused and logged, and the job must
end as an undisturbed one does.
"""
import os
import shutil
import socket
import sys
import textwrap
import threading
import time
from collections import defaultdict

import numpy as np
import pytest

import jobs
from ps_helpers import VANS, cluster_fixture, zmq_job_dealer
from test_security import TRAIN as SECURITY_TRAIN, meta as encode_meta, train as security_train

pytestmark = pytest.mark.cluster
cluster = pytest.fixture(cluster_fixture)

SERVERS, WORKERS = 1, 2
SCHEDULER_ID, SERVER_ID, WORKER_IDS = 0, 1, (2, 3)
K_NODE_LIST, K_HEARTBEAT, K_EXIT, K_NODE_DEAD = 2, 5, 7, 10   # Control, ps-lite/src/postoffice.h
K_SAVE, K_LOAD, K_CLEAR = 8, 9, 10   # Op, ps-lite/src/kv.h

# test_security's BSP training (the workers stop half way until the test says go; worker 0
# writes the final table), where worker 0 first clears, saves and loads the table: harmless at
# the start, and so on the wire to be recorded.
ADMIN = """
if ps.rank() == 0:
    t.clear().wait()
    t.save(ARGS["ckpt"]).wait()
    t.load(ARGS["ckpt"]).wait()
ps.barrier()
"""
INIT = 'seed=7)\n'
assert SECURITY_TRAIN.count(INIT) == 1
TRAIN = SECURITY_TRAIN.replace(INIT, INIT + ADMIN.lstrip("\n"))


# ---- the eavesdropper

class Sniffer:
    """Every TCP payload byte on loopback while it runs, by connection (source port,
    destination port), as an eavesdropper on the job's network sees it."""

    def __init__(self):
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        except (PermissionError, AttributeError, OSError) as e:
            pytest.skip(f"cannot sniff loopback (needs CAP_NET_RAW on Linux): {e}")
        try:   # a loaded machine must not make the kernel drop what the test needs
            self.sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 64 << 20)
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.1)
        self.segments = defaultdict(dict)   # (sport, dport) -> {seq: payload}
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.is_set():
            try:
                frame, addr = self.sock.recvfrom(1 << 18)
            except socket.timeout:
                continue
            if addr[2] == socket.PACKET_OUTGOING:   # loopback shows each packet twice
                continue
            ip = frame[14:]
            if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
                continue
            tcp = ip[(ip[0] & 15) * 4:int.from_bytes(ip[2:4], "big")]
            payload = tcp[(tcp[12] >> 4) * 4:]
            if payload:
                key = (int.from_bytes(tcp[0:2], "big"), int.from_bytes(tcp[2:4], "big"))
                with self.lock:
                    self.segments[key].setdefault(int.from_bytes(tcp[4:8], "big"), payload)

    def streams(self):
        """(sport, dport) -> the bytes sent, in order."""
        time.sleep(0.3)
        out = {}
        with self.lock:
            items = [(k, dict(v)) for k, v in self.segments.items()]
        for key, segs in items:
            base = min(segs)
            data, end = bytearray(), None
            for seq in sorted(segs, key=lambda s: (s - base) % 2**32):
                at = (seq - base) % 2**32
                if end is None or at >= end:
                    data += segs[seq]
                    end = at + len(segs[seq])
            out[key] = bytes(data)
        return out

    def close(self):
        self.done.set()
        self.thread.join()
        self.sock.close()


# ---- ps.pb.Meta (ps-lite/proto/meta.proto), read by hand: an outsider needs nothing of the
# job for it.

def _read_varint(b, at):
    n = shift = 0
    while True:
        if at >= len(b) or shift > 63:
            raise ValueError("truncated varint")
        n |= (b[at] & 0x7F) << shift
        at += 1
        shift += 7
        if not b[at - 1] & 0x80:
            return n, at


def decode_meta(b):
    """{field number: value} of a Meta's scalar and string fields; ValueError if it is none."""
    fields, at = {}, 0
    while at < len(b):
        key, at = _read_varint(b, at)
        number, kind = key >> 3, key & 7
        if not 1 <= number <= 23:
            raise ValueError("not a Meta field")
        if kind == 0:
            value, at = _read_varint(b, at)
            value = value - (1 << 64) if value >> 63 else value
        elif kind == 2:
            size, at = _read_varint(b, at)
            value, at = bytes(b[at:at + size]), at + size
            if at > len(b):
                raise ValueError("truncated field")
        elif kind == 5:
            value, at = bytes(b[at:at + 4]), at + 4
        else:
            raise ValueError("not a Meta wire type")
        fields.setdefault(number, value)
    return fields


# ---- what was recorded, per van: Recorded(target port, meta fields, frames or header,
# credential), so that the outsider can send it again.

class Recorded:
    def __init__(self, port, meta, wire, credential):
        self.port, self.meta, self.wire, self.credential = port, meta, wire, credential

    def is_(self, control=0, op=None, sender=None):
        m = self.meta
        return (m.get(1, 0) == control and (op is None or m.get(5, 0) == op) and
                (sender is None or m.get(2, 0) == sender) and (control != 0 or m.get(4, 0) == 1))


def _zmtp(stream):
    """(PLAIN username and password, [messages as frame lists]) of a DEALER's stream."""
    if len(stream) < 64 or stream[0] != 0xFF or stream[9] != 0x7F:
        return None, []
    at, credential, messages, parts = 64, None, [], []
    while at < len(stream):
        flags = stream[at]
        if flags & 2:
            size, at = int.from_bytes(stream[at + 1:at + 9], "big"), at + 9
        else:
            size, at = stream[at + 1], at + 2
        body, at = stream[at:at + size], at + size
        if flags & 4:   # a command; PLAIN's HELLO holds the username and the password
            name = body[1:1 + body[0]]
            if name == b"HELLO":
                rest = body[1 + body[0]:]
                user = rest[1:1 + rest[0]]
                password = rest[2 + rest[0]:2 + rest[0] + rest[1 + rest[0]]]
                credential = (user, password)
            continue
        parts.append(body)
        if not flags & 1:
            messages.append(parts)
            parts = []
    return credential, messages


def _meta_of(frames):
    """Index and fields of the meta among a message's frames (after a tag, if any)."""
    for i, f in enumerate(frames[:2]):
        if f.startswith(b"HMA1"):
            continue
        try:
            return i, decode_meta(f)
        except ValueError:
            return None, None
    return None, None


def recorded_zmq(streams, ports=None):
    """Messages of the DEALER streams to `ports` (None: to any port)."""
    out = []
    for (_, dport), stream in streams.items():
        if ports is not None and dport not in ports:
            continue
        credential, messages = _zmtp(stream)
        for frames in messages:
            i, meta = _meta_of(frames)
            if meta is not None:
                out.append(Recorded(dport, meta, frames, credential))
    return out


UCX_MAGIC = b"HPS1"


def recorded_ucx(streams, _ports=None):
    """The van's active messages without payload, found in UCX's TCP streams: a UCP header
    (id, flags, user header length), then the user header, the van's whole message."""
    out = []
    for _, stream in streams.items():
        at = stream.find(UCX_MAGIC)
        while at >= 0:
            for start in range(max(0, at - 128), at):
                if start < 8 or int.from_bytes(stream[start - 8:start - 6], "little") != 7:
                    continue
                length = int.from_bytes(stream[start - 4:start], "little")
                header = stream[start:start + length]
                if not start < at < start + length or len(header) != length:
                    continue
                try:
                    meta = decode_meta(header[at - start + 8:])
                except ValueError:
                    continue
                out.append(Recorded(None, meta, header, header[:at - start]))
                break
            at = stream.find(UCX_MAGIC, at + 1)
    return out


# ---- the outsider: a new connection for each message

def _replay_zmq(port, frame_lists, credential):
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    for frames in frame_lists:
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 1000)
        d.setsockopt(zmq.SNDTIMEO, 1000)
        d.plain_username, d.plain_password = credential
        d.connect(f"tcp://127.0.0.1:{port}")
        try:
            d.send_multipart(frames)
        except zmq.Again:
            pass
        d.close()
    ctx.term()


def _replay_ucx(port, headers):
    env = {k: v for k, v in os.environ.items() if k != "HETU_JOB_SECRET"}
    code = textwrap.dedent(f"""
        from hetu import _ps
        for header in {[h.hex() for h in headers]!r}:
            _ps._ucx_send_raw("127.0.0.1", {port}, bytes.fromhex(header), b"")
    """)
    jobs.run([sys.executable, "-c", code], env=env, timeout=120, check=True, capture_output=True)


def train(cluster, tmp_path, van, ckpt, secret=None, outsider=None, env=None):
    env = {"UCX_TLS": "tcp", **(env or {})}   # TCP, so that UCX's messages are on the wire too
    if secret:
        env["HETU_JOB_SECRET"] = secret
    return security_train(cluster, tmp_path, van, outsider, env, TRAIN, {"ckpt": str(ckpt)})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("van", VANS)
def test_messages_seen_on_the_wire_command_nothing(cluster, tmp_path, van):
    record = recorded_zmq if van == "zmq" else recorded_ucx
    sniffer = Sniffer()
    try:
        first_ckpt, ckpt = tmp_path / "first_ckpt", tmp_path / "ckpt"
        reference, first = train(cluster, tmp_path, van, first_ckpt)
        from_first = record(sniffer.streams())
        secret = first.base_env["HETU_JOB_SECRET"]
        shutil.rmtree(first_ckpt)   # a replayed kSave of the first job would write it again
        sniffer.segments.clear()
        saved = {}

        def outsider(ports):
            seen = record(sniffer.streams(), set(ports.values()))
            # Worker 0's commands of this job and of the first, and the first job's kExits, each
            # alone on a new connection. An obeyed kClear or kLoad would put back the table of
            # the start; an obeyed kSave writes again.
            admin = [r for r in seen + from_first if r.is_(0, K_CLEAR)]
            admin += [r for r in seen + from_first if r.is_(0, K_LOAD)]
            admin += [r for r in seen + from_first if r.is_(0, K_SAVE)]
            exits = [r for r in from_first if r.is_(K_EXIT, sender=WORKER_IDS[0]) or
                     r.is_(K_EXIT, sender=WORKER_IDS[1])]
            assert {r.meta.get(5) for r in admin} == {K_CLEAR, K_SAVE, K_LOAD} and len(exits) >= 2, \
                [r.meta for r in seen + from_first]
            # A kNodeDead in the scheduler's name, behind what its own connection to the server
            # carried (the node list names the node it goes to): ZMQ, the password and a
            # message's tag; UCX, a message's head.
            from_scheduler = [r for r in seen if r.is_(K_NODE_LIST, sender=SCHEDULER_ID) and
                              r.meta.get(10) == SERVER_ID]
            assert from_scheduler, [r.meta for r in seen]
            dead = encode_meta(K_NODE_DEAD, SCHEDULER_ID, error=b"forged death")
            saved.update((p, p.stat().st_mtime_ns) for p in ckpt.rglob("*"))
            if van == "zmq":
                r = from_scheduler[-1]
                i, _ = _meta_of(r.wire)
                _replay_zmq(ports["server"], [a.wire for a in admin], r.credential)
                _replay_zmq(ports["scheduler"], [a.wire for a in exits], r.credential)
                _replay_zmq(ports["server"], [r.wire[:i] + [dead]], r.credential)
                _replay_zmq(ports["worker"], [r.wire[:i] + [dead]], r.credential)
            else:
                r = from_scheduler[-1]
                _replay_ucx(ports["server"], [a.wire for a in admin] +
                            [r.credential + UCX_MAGIC + bytes(4) + dead])
                _replay_ucx(ports["scheduler"], [a.wire for a in exits])
            time.sleep(1.5)   # a kNodeDead, a kExit or a kLoad obeyed would show within this

        got, c = train(cluster, tmp_path, van, ckpt, secret, outsider)
    finally:
        sniffer.close()
    np.testing.assert_array_equal(got, reference)
    assert saved and {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")} == saved, "a replayed kSave was obeyed"
    assert not first_ckpt.exists(), "a replayed kSave of the first job was obeyed"
    logs = c.logs()
    assert "forged death" not in logs, logs
    for name in ("scheduler", "server0") + (("worker1",) if van == "zmq" else ()):
        assert "dropped a " in c.log(name) or "refused a " in c.log(name), c.log(name)


def _member(port, secret):
    """A connection of a holder of the job's secret, as message_auth.h makes one: hello,
    welcome, then tagged messages. Returns (close, send(meta bytes))."""
    import hashlib
    import hmac
    zmq = pytest.importorskip("zmq")

    def mac(key, *pieces):
        return hmac.new(key, b"".join(pieces), hashlib.sha256).digest()

    ctx = zmq.Context()
    d = zmq_job_dealer(ctx, port, secret)
    d.setsockopt(zmq.RCVTIMEO, 10000)
    message_key, nonce = mac(secret.encode(), b"hetu ps message key"), os.urandom(16)
    d.send(b"HMA1H" + nonce + mac(message_key, b"hello", nonce))
    welcome = d.recv()
    assert welcome[:5] == b"HMA1W" and welcome[5:21] == nonce, welcome
    key = mac(message_key, b"connection", nonce, welcome[21:37])
    seq = iter(range(1, 1 << 62))

    def send(meta_bytes):
        n = next(seq).to_bytes(8, "little")
        tag = mac(key, n, len(meta_bytes).to_bytes(8, "little"), meta_bytes, bytes(8))
        d.send_multipart([b"HMA1M" + nonce + n + tag + b"\0", meta_bytes])   # the ZMQ van pads the tag frame

    def close():
        d.close()
        ctx.term()
    return close, send


@pytest.mark.timeout(120)
def test_a_connection_speaks_only_for_the_node_it_first_sent_from(cluster, tmp_path):
    """Even a holder of the secret: a connection that spoke as worker 1 cannot then speak as
    the scheduler."""
    secret = "a secret the test knows"

    def outsider(ports):
        close, send = _member(ports["server"], secret)
        send(encode_meta(K_HEARTBEAT, WORKER_IDS[1]))   # taken (and ignored: not the scheduler's)
        send(encode_meta(K_NODE_DEAD, SCHEDULER_ID, error=b"forged death"))
        time.sleep(1)
        close()

    _, c = train(cluster, tmp_path, "zmq", tmp_path / "ckpt", secret, outsider, {"PS_VERBOSE": "1"})
    log = c.log("server0")
    assert f"ignored control {K_HEARTBEAT} from node {WORKER_IDS[1]}" in log, log
    assert f"dropped a message that claims to come from node {SCHEDULER_ID} on the connection of node " \
           f"{WORKER_IDS[1]}" in log, log
    assert "forged death" not in c.logs()
