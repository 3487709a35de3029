"""A fault-injecting HTTP proxy for the tests: sits between shardflow and nginx and misbehaves on request.

Each request for a path takes the next action from the plan the test gave for that path
(then "pass" once the plan is used up):

    "pass"                      forward to nginx and relay the answer
    ("reset", n)                relay the headers and n body bytes, then reset the connection (RST)
    ("reset", n, hook)          the same, calling hook() just before the reset (e.g. to change the file)
    ("stall", n, seconds)       relay n body bytes, go silent for `seconds`, then relay the rest
    ("status", code, retry)     answer `code` (e.g. 503) with Retry-After: retry (None: no header)
    "ignore_range"              forward without Range / If-Match: nginx answers 200 with the whole body
    ("changed", honest)         serve a different object (another body, another ETag); honest: answer
                                412 to an If-Match naming the old ETag, as a real server would;
                                dishonest: ignore If-Match and serve the changed bytes from the Range

FaultProxy(port, plan, delay=0.1) also holds every answer back for 0.1 s (a distant server's latency).
Every request is logged as a dict (path, range, if_match, if_none_match, action, time) in proxy.log.
Only Debian's /usr/bin/python3 standard library; one thread per client connection.
"""
import http.client
import socket
import struct
import threading
import time


class FaultProxy:
    def __init__(self, upstream_port, plan=None, upstream_host="127.0.0.1", delay=0.0):
        self.upstream = (upstream_host, upstream_port)
        self.delay = delay  # seconds before every answer: a far-away server's time to first byte
        self.plan = {k: list(v) for k, v in (plan or {}).items()}
        self.log = []
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.closing = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def close(self):
        self.closing = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def requests(self, path):
        with self.lock:
            return [r for r in self.log if r["path"] == path]

    # ---- plumbing ----

    def _accept(self):
        while not self.closing:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _next_action(self, path):
        with self.lock:
            steps = self.plan.get(path)
            return steps.pop(0) if steps else "pass"

    @staticmethod
    def _read_request(conn, buf):
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return None, b""
            buf += data
        head, rest = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        return (method, target, headers), rest

    def _upstream(self, method, target, headers):
        c = http.client.HTTPConnection(*self.upstream, timeout=30)
        fwd = {k: v for k, v in headers.items() if k not in ("connection", "host", "keep-alive")}
        c.request(method, target, headers=fwd)
        r = c.getresponse()
        body = r.read()
        out = (r.status, r.reason, [(k, v) for k, v in r.getheaders()
                                    if k.lower() not in ("connection", "keep-alive", "transfer-encoding")], body)
        c.close()
        return out

    @staticmethod
    def _head(status, reason, headers, length):
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{k}: {v}" for k, v in headers if k.lower() != "content-length"]
        lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    @staticmethod
    def _reset(conn):
        # SO_LINGER with a zero timeout: close() sends RST instead of FIN.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    def _serve(self, conn):
        buf = b""
        try:
            while True:
                req, buf = self._read_request(conn, buf)
                if req is None:
                    return
                method, target, headers = req
                path = target.split("?")[0]
                action = self._next_action(path)
                kind = action if isinstance(action, str) else action[0]
                with self.lock:
                    self.log.append(dict(path=path, range=headers.get("range"), if_match=headers.get("if-match"),
                                         if_none_match=headers.get("if-none-match"), action=kind,
                                         time=time.monotonic()))
                if self.delay:
                    time.sleep(self.delay)
                if not self._answer(conn, method, target, headers, action, kind):
                    return
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _answer(self, conn, method, target, headers, action, kind):
        """Answers one request; returns False when the connection is finished."""
        if kind == "status":
            _, code, retry = action
            extra = [("Retry-After", str(retry))] if retry is not None else []
            body = b"try again later\n"
            conn.sendall(self._head(code, "Fault", extra + [("Content-Type", "text/plain")], len(body)) + body)
            return True
        if kind == "ignore_range":
            headers = {k: v for k, v in headers.items() if k not in ("range", "if-match")}
        if kind == "changed":
            return self._changed(conn, method, target, headers, action[1])
        status, reason, rheaders, body = self._upstream(method, target, headers)
        head = self._head(status, reason, rheaders, len(body))
        if kind == "reset":
            conn.sendall(head + body[:action[1]])
            time.sleep(0.3)  # let the client read what was sent before the RST discards it
            if len(action) > 2:
                action[2]()  # before the reset: the retry must find the change made
            self._reset(conn)
            return False
        if kind == "stall":
            _, n, seconds = action
            conn.sendall(head + body[:n])
            time.sleep(seconds)
            conn.sendall(body[n:])  # the client has usually given up by now: an OSError ends this thread
            return True
        conn.sendall(head + body)
        return True

    def _changed(self, conn, method, target, headers, honest):
        status, reason, rheaders, body = self._upstream(method, target, {})
        etag = '"changed-object"'
        changed = bytes(b ^ 0x5A for b in body)  # same size, every byte different: a splice shows
        if honest and headers.get("if-match") not in (None, "*", etag):
            msg = b"precondition failed\n"
            conn.sendall(self._head(412, "Precondition Failed", [("ETag", etag)], len(msg)) + msg)
            return True
        rng = headers.get("range")
        rh = [(k, v) for k, v in rheaders if k.lower() not in ("etag", "content-range")] + [("ETag", etag)]
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            part = changed[start:]
            rh.append(("Content-Range", f"bytes {start}-{len(changed) - 1}/{len(changed)}"))
            conn.sendall(self._head(206, "Partial Content", rh, len(part)) + part)
        else:
            conn.sendall(self._head(200, "OK", rh, len(changed)) + changed)
        return True
