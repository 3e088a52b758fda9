"""What the terrace serve tests share: starting a server on a free port of 127.0.0.1, raw HTTP
requests, the /metrics counters, and a test tally."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time

import tally
from tally import check  # noqa: F401 (the serve tests take it from here)


def done(name):
    if tally.failures:
        print(f"{name}: {tally.failures} check(s) FAILED", file=sys.stderr)
        sys.exit(1)
    print(f"{name}: all checks passed")


class Server:
    """terrace serve on port 0 (the kernel picks a free one; the server prints it)"""

    def __init__(self, terrace, model, *args, env=None):
        self.log = open(os.environ.get("TMPDIR", "/tmp") + f"/terrace-serve-{os.getpid()}-{id(self)}.log", "w+")
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen([terrace, "serve", "-m", model, "--port", "0", *args],
                                  stdout=self.log, stderr=subprocess.STDOUT, env=e)
        self.port = None
        deadline = time.time() + 120  # an ASan build loads slowly on a busy machine
        while time.time() < deadline and self.p.poll() is None:
            self.log.flush()
            text = open(self.log.name).read()
            m = re.search(r"listening on http://[^:]+:(\d+)/", text)
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.05)
        if not self.port:
            raise RuntimeError("the server did not start:\n" + open(self.log.name).read())

    def output(self):
        self.log.flush()
        return open(self.log.name).read()

    def conn(self, timeout=300):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, headers, parsed JSON or text)"""
        c = self.conn()
        h = dict(headers or {})
        if body is not None and raw is None:
            raw = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=raw, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        try:
            return r.status, dict(r.getheaders()), json.loads(data)
        except ValueError:
            return r.status, dict(r.getheaders()), data.decode("utf-8", "replace")

    def metrics(self, headers=None):
        """the unlabelled counters, and the labelled ones by their full name"""
        st, _, text = self.request("GET", "/metrics", headers=headers)
        assert st == 200, text
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line:
                continue
            name, value = line.rsplit(" ", 1)
            out[name.replace("terrace_", "", 1)] = float(value)
        return out, text

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait()


def sse_events(resp):
    """the data: payloads of an SSE response, as they arrive ('[DONE]' included)"""
    buf = b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                if line.startswith(b"data: "):
                    yield line[6:].decode()
