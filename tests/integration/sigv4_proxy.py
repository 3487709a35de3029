"""A SigV4-checking reverse proxy for the s3:// tests.

s3rver (3.7.1, the latest) parses SigV4 Authorization headers and refuses unknown access key ids, but never
checks V4 signatures ("Signature version 4 calculation is unimplemented" in its authentication middleware).
This proxy sits in front of it and checks every request as S3 would, with botocore's signer as the reference:
the canonical request is rebuilt from the bytes received (method, path and query exactly as on the wire, the
signed headers' values), signed with the secret the proxy knows for the key id, and compared with the request's
signature; the payload hash is compared with the body's SHA-256. A mismatch is answered 403
SignatureDoesNotMatch (400 XAmzContentSHA256Mismatch) in S3's XML, as S3 does; anything else is forwarded.
"""
import contextlib
import hashlib
from xml.sax.saxutils import escape
import http.client
import http.server
import re
import threading

import botocore.auth
import botocore.awsrequest
import botocore.credentials

AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                  r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$")


def _error(code, message):
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{escape(message)}'
            f"</Message></Error>").encode()


class Proxy:
    def __init__(self, upstream_port, secrets):
        self.upstream_port = upstream_port
        self.secrets = secrets          # access key id -> secret
        self.seen = []                  # (method, path, verdict) per request
        self.fail = None                # fail(method, path) -> True (or a message): answer 500 InternalError instead
        self.lock = threading.Lock()

    def check(self, method, path, headers, body):
        """None when the request is correctly signed (or has an unknown key id: upstream refuses it), else the
        (status, code, message) to answer."""
        m = AUTH.match(headers.get("Authorization", ""))
        if not m:
            return 403, "AccessDenied", "no AWS4-HMAC-SHA256 Authorization header"
        key_id, date, region, service, signed, signature = m.groups()
        if key_id not in self.secrets:
            return None
        names = signed.split(";")
        if names != sorted(names) or not {"host", "x-amz-date", "x-amz-content-sha256"} <= set(names):
            return 403, "SignatureDoesNotMatch", f"bad SignedHeaders {signed}"
        payload = headers.get("x-amz-content-sha256", "")
        if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
            return 400, "XAmzContentSHA256Mismatch", "the body's SHA-256 is not x-amz-content-sha256"
        timestamp = headers.get("x-amz-date", "")
        if timestamp[:8] != date:
            return 403, "SignatureDoesNotMatch", "the credential scope's date is not x-amz-date's"
        request = botocore.awsrequest.AWSRequest(method=method, url=f"http://{headers['host']}{path}",
                                                 headers={n: headers.get(n, "") for n in names}, data=body)
        request.context["timestamp"] = timestamp
        auth = botocore.auth.S3SigV4Auth(botocore.credentials.Credentials(key_id, self.secrets[key_id]),
                                         service, region)
        canonical = auth.canonical_request(request)
        expected = auth.signature(auth.string_to_sign(request, canonical), request)
        if expected != signature:
            return 403, "SignatureDoesNotMatch", ("The request signature we calculated does not match the "
                                                  "signature you provided. Check your key and signing method.")
        return None

    def handler(self):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                headers["Authorization"] = self.headers.get("Authorization", "")
                verdict = proxy.check(self.command, self.path, headers, body)
                failed = not verdict and proxy.fail and proxy.fail(self.command, self.path)
                if failed:
                    verdict = (500, "InternalError", failed if isinstance(failed, str) else "injected by the test")
                with proxy.lock:
                    proxy.seen.append((self.command, self.path, verdict[1] if verdict else "ok"))
                if verdict:
                    status, code, message = verdict
                    data = _error(code, message)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                forward = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "expect")}
                conn.request(self.command, self.path, body=body if length else None, headers=forward)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

        return Handler


@contextlib.contextmanager
def sigv4_proxy(upstream_port, secrets):
    """Runs the checking proxy on a free loopback port in front of 127.0.0.1:upstream_port; yields the Proxy
    (its .port, and .seen: the requests and their verdicts)."""
    proxy = Proxy(upstream_port, secrets)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), proxy.handler())
    server.daemon_threads = True
    proxy.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
