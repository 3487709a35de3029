"""Hostile peers against a real head listening on tcp://127.0.0.1 with CURVE and an allow-list.

One `shardflow run` of a graph whose decode and augment stages sit in group `decoders`
(listen: tcp://127.0.0.1:PORT, secret_key, allowed_keys: a directory of *.pub), one legitimate
`shardflow worker` with a listed key, and attackers written with Debian's python3-zmq:

  not admitted (the transport refuses them; counted as "connections refused"):
    - a NULL-mechanism DEALER, a PLAIN DEALER, a CURVE DEALER whose key is not listed;
    - garbage on the raw TCP port (an HTTP request, seeded random bytes);
  admitted (a listed key, `evil`), then sending what the wire decoder must reject
  (counted as "malformed messages dropped"):
    - random header bytes, a header of another wire version, a RESULT header whose field claims
      a payload frame that is not there, one whose shape claims more bytes than its frame has,
      a message of 40 empty frames;
    - a frame larger than the group's max_message (libzmq drops that connection: not delivered,
      not counted by the head; the legitimate stream must go on);
  plus a connection that never says anything (held open through the run; it must not block anyone).

Expected: the run succeeds; every epoch holds each key exactly once and the batches equal a
single-process run of the same graph; the head's summary counts exactly the refusals and malformed
messages sent (refusals: at least those, at most one more for the silent connection); the head logs
refusals with the peer's address and the unknown key.  Attacks run twice: before the worker joins
and in the middle of the epochs.
"""
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import sfutil   # noqa: E402
from sfutil import SHARDFLOW, Checks, free_port, group_graph, make_dataset, read_batches, run, wait_for  # noqa: E402

try:
    import zmq
except ImportError:
    print("skip: python3-zmq is not installed (tools/setup-debian.sh installs it)")
    sys.exit(77)

check = Checks()
EPOCHS, BATCH = 2, 16
MAX_MESSAGE = 1 << 20


# ---------------------------------------------------------------- protobuf, by hand (engine/group/wire.proto)
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, value):
    return varint(num << 3) + varint(value)


def field_bytes(num, data):
    return varint((num << 3) | 2) + varint(len(data)) + data


def result_header(version, shape, frame):
    """Header{version, type RESULT, unit 0, samples [SampleMeta{key, fields [FieldMeta{jpg, uint8, shape, frame}]}]}."""
    fmeta = field_bytes(1, b"jpg") + field_varint(2, 1) + field_varint(3, 0) + \
        field_bytes(4, b"".join(varint(s) for s in shape)) + field_varint(5, frame)
    sample = field_bytes(1, b"evil-key") + field_varint(6, 0) + field_bytes(9, fmeta)
    return field_varint(1, version) + field_varint(2, 5) + field_varint(3, 0) + field_bytes(11, sample) + \
        field_varint(12, 1)


def key_of(path):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("public-key") or line.startswith("secret-key"):
                yield line.split("=", 1)[0].strip(), line.split('"')[1].encode()


def keypair(path):
    keys = dict(key_of(path))
    return keys["public-key"], keys["secret-key"]


# ---------------------------------------------------------------- attackers
class Attackers:
    def __init__(self, ctx, port, keys):
        self.ctx, self.port, self.keys = ctx, port, keys
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.server_pub = dict(key_of(os.path.join(keys, "head.pub")))["public-key"]
        self.refused = 0      # connections the transport must refuse
        self.malformed = 0    # messages the head's decoder must drop
        self.log = []

    def dealer(self, mechanism, key=None):
        s = self.ctx.socket(zmq.DEALER)
        s.linger = 0
        s.setsockopt(zmq.RECONNECT_IVL, -1)  # one connection per attacker: the counts stay exact
        if mechanism == "PLAIN":
            s.plain_username, s.plain_password = b"admin", b"admin"
        elif mechanism == "CURVE":
            pub, sec = keypair(os.path.join(self.keys, key + ".key"))
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = self.server_pub, pub, sec
        mon = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED |
                                   zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        s.connect(self.endpoint)
        return s, mon

    @staticmethod
    def outcome(mon, timeout=5.0):
        """The first handshake outcome the client's monitor reports: 'ok', 'auth', 'failed' or 'closed'."""
        from zmq.utils.monitor import recv_monitor_message
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if mon.poll(100):
                ev = recv_monitor_message(mon)["event"]
                if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    return "ok"
                if ev == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    return "auth"
                if ev in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                    return "failed"
                if ev == zmq.EVENT_DISCONNECTED:
                    return "closed"
        return "timeout"

    def refused_client(self, mechanism, key=None):
        s, mon = self.dealer(mechanism, key)
        try:
            s.send_multipart([field_varint(1, 1) + field_varint(2, 1) + field_bytes(7, b"intruder")], zmq.NOBLOCK)
        except zmq.Again:
            pass
        got = self.outcome(mon)
        check(got != "ok", f"a {mechanism} client{' with key ' + key if key else ''} completed a handshake")
        self.refused += 1
        self.log.append(f"{mechanism}{'/' + key if key else ''}: {got}")
        mon.close()
        s.close()

    def garbage(self, data, what):
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as c:
            try:
                c.sendall(data)
                c.shutdown(socket.SHUT_WR)
                while c.recv(4096):
                    pass
            except OSError:
                pass  # reset by the head: fine
        self.refused += 1
        self.log.append(f"garbage ({what}): closed")

    def listed_with_bad_messages(self):
        s, mon = self.dealer("CURVE", "evil")
        got = self.outcome(mon)
        check(got == "ok", f"the listed key 'evil' is admitted by the transport (got {got})")
        rng = random.Random(7)
        bad = [
            [bytes(rng.randrange(256) for _ in range(300))],                   # random header bytes
            [result_header(99, [4], 0), b"abcd"],                              # another wire version
            [result_header(1, [4], 3), b"abcd"],                               # a frame that is not there
            [result_header(1, [1 << 20], 0), b"0123456789"],                   # more bytes than the frame has
            [b""] * 40,                                                        # empty frames
        ]
        for frames in bad:
            s.send_multipart(frames)
            self.malformed += 1
        time.sleep(0.3)
        s.send(b"\0" * (2 * MAX_MESSAGE))  # over max_message: libzmq drops this connection
        time.sleep(0.3)
        self.log.append(f"evil: {len(bad)} malformed messages, one oversized frame")
        mon.close()
        s.close()

    def round(self):
        self.refused_client("NULL")
        self.refused_client("PLAIN")
        self.refused_client("CURVE", "stranger")
        self.garbage(b"GET / HTTP/1.1\r\nHost: head\r\n\r\n", "HTTP request")
        self.garbage(bytes(random.Random(3).randrange(256) for _ in range(4096)), "random bytes")
        self.listed_with_bad_messages()


def listening(port):
    """Whether a socket listens on 127.0.0.1:port (read from /proc: no connection that would be counted)."""
    want = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in f.readlines()[1:]:
                    parts = line.split()
                    if parts[1].endswith(want) and parts[3] == "0A":
                        return True
        except OSError:
            pass
    return False


def main():
    tmp = tempfile.mkdtemp(prefix="sf-hostile-")
    procs = []
    ctx = zmq.Context()
    silent = None
    try:
        urls, truth = make_dataset(tmp, shards=6, per_shard=200, size=16)

        def graph(name, group):
            return group_graph(tmp, name, urls, group, shuffle_buffer=300, batch_size=BATCH, seed=9, epochs=EPOCHS)

        ref_path, ref_out = graph("reference", None)
        run(["run", ref_path, "--quiet", "--no-summary"])
        reference = read_batches(ref_out)

        keys = os.path.join(tmp, "keys")
        allowed = os.path.join(keys, "allowed")
        os.makedirs(allowed)
        for name in ("head", "w1", "evil", "stranger"):
            run(["keygen", name, "--dir", keys])
        for name in ("w1", "evil"):
            shutil.copy(os.path.join(keys, name + ".pub"), allowed)
        stranger_pub = dict(key_of(os.path.join(keys, "stranger.pub")))["public-key"].decode()

        port = free_port()
        path, out = graph("group", {"listen": f"tcp://127.0.0.1:{port}", "secret_key": f"{keys}/head.key",
                                    "allowed_keys": allowed, "max_message": "1MiB", "worker_timeout": "60s",
                                    "unit_samples": 20})
        head_log = os.path.join(tmp, "head.log")
        with open(head_log, "w") as log:
            head = subprocess.Popen([SHARDFLOW, "run", path, "--log-steps", "0", "--step-time", "0.05"],
                                    stdout=log, stderr=subprocess.STDOUT, text=True)
        procs.append(head)
        wait_for(lambda: listening(port) or head.poll() is not None, 30, "the head to listen")
        check(head.poll() is None, "the head is running")

        attackers = Attackers(ctx, port, keys)
        silent = socket.create_connection(("127.0.0.1", port), timeout=10)  # says nothing, stays open
        t0 = time.monotonic()
        attackers.round()  # before any worker: the head only waits
        print(f"first round of attacks: {time.monotonic() - t0:.1f} s")

        worker_log = os.path.join(tmp, "w1.log")
        with open(worker_log, "w") as log:
            worker = subprocess.Popen([SHARDFLOW, "worker", "--connect", f"tcp://127.0.0.1:{port}",
                                       "--key", f"{keys}/w1.key", "--server-key", f"{keys}/head.pub",
                                       "--name", "w1", "--connect-timeout", "20"],
                                      stdout=log, stderr=subprocess.STDOUT, text=True)
        procs.append(worker)
        # The second round while the worker is busy (the run lasts >= EPOCHS * batches * step-time).
        time.sleep(0.5)
        check(head.poll() is None, "the head is still running when the second round starts")
        attackers.round()
        check(head.poll() is None, "the second round ended while the head was still running its epochs")
        rc = head.wait(timeout=120)
        with open(head_log) as f:
            hlog = f.read()
        check(rc == 0, f"the head's run succeeds, not {rc}:\n{hlog[-4000:]}")
        check(worker.wait(timeout=30) == 0, "the worker ends cleanly with the run")
        print("\n".join(attackers.log))

        # The legitimate stream is unharmed.
        got = read_batches(out)
        check(len(got) == len(reference), f"{len(got)} batches, one process made {len(reference)}")
        for (e, b, k, fields), (re_, rb, rk, rfields) in zip(got, reference):
            check((e, b) == (re_, rb) and k == rk, f"epoch {e} batch {b}: keys differ from one process's")
            for name in rfields:
                check(np.array_equal(fields[name], rfields[name]), f"epoch {e} batch {b}: {name} differs")
        for e in range(EPOCHS):
            seen = sorted(k for (ee, _, ks, _) in got if ee == e for k in ks)
            check(seen == sorted(truth), f"epoch {e}: each key exactly once ({len(seen)} keys, {len(truth)} expected)")

        # Counted, and logged with address and key.
        summary = [x for x in hlog.splitlines() if x.startswith("group decoders:")]
        check(summary, f"the head prints the group's summary:\n{hlog[-3000:]}")
        print(summary[0] if summary else "(no summary)")
        if summary:
            malformed = int(summary[0].split(" malformed messages dropped")[0].rsplit(", ", 1)[1])
            refused = int(summary[0].split(" connections refused")[0].rsplit(", ", 1)[1])
            check(malformed == attackers.malformed, f"{malformed} malformed messages counted, {attackers.malformed} sent")
            check(attackers.refused <= refused <= attackers.refused + 1,
                  f"{refused} connections refused counted, {attackers.refused} attempts (+1 silent) made")
        refusals = [x for x in hlog.splitlines() if "refused" in x and "127.0.0.1" in x]
        check(any(stranger_pub in x for x in refusals), f"a refusal line names the unknown key {stranger_pub}")
        check(any("NULL or PLAIN" in x for x in refusals), "a refusal line names the wrong mechanism")
        check("Replica Train Samples=" in hlog, "the head reports its epochs")
        check.done("hostile_peers")
        return 0
    finally:
        if silent:
            silent.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        ctx.destroy(linger=0)
        if os.environ.get("SF_KEEP_TMP"):
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
