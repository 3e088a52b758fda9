#!/usr/bin/env python3
"""The live page of terrace serve in headless Chromium, against a live server with an API key:
the page loads from GET /, its script reads /telemetry (SSE) with the key, sends one message
through its chat box (?selftest=1) and streams the answer; then the DOM is read through the
DevTools protocol (over --remote-debugging-pipe, no extra package) to check that every chart
received samples, that the throughput and memory charts saw non-zero values, and that the chat
answer arrived. A screenshot is written next to the log.

usage: test_serve_page.py TERRACE MODEL [SCREENSHOT.png]
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import serve_util as su
from serve_util import check

TERRACE, MODEL = sys.argv[1], sys.argv[2]
SHOT = sys.argv[3] if len(sys.argv) > 3 else None
KEY = "page-test-key"

browser = next((p for p in ("/usr/lib/chromium/chromium", shutil.which("chromium"),
                            shutil.which("chromium-browser")) if p and os.path.exists(p)), None)
if not browser:
    print("test_serve_page: FAIL: chromium is not installed (scripts/deps.sh installs it)")
    sys.exit(1)


class DevTools:
    """Chromium's DevTools protocol over its pipe: NUL-terminated JSON on fds 3 (in) and 4 (out)"""

    def __init__(self, profile):
        r_in, self.w = os.pipe()
        self.r, w_out = os.pipe()

        def child():
            # dup first: a pipe fd is close-on-exec, and dup2 onto itself would keep that flag
            a, b = os.dup(r_in), os.dup(w_out)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.p = subprocess.Popen([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                                   "--remote-debugging-pipe", f"--user-data-dir={profile}",
                                   "--window-size=1280,800", "about:blank"],
                                  preexec_fn=child, close_fds=False, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        os.close(r_in)
        os.close(w_out)
        self.buf = b""
        self.n = 0

    def call(self, method, params=None, session=None, timeout=60):
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\0" not in self.buf:
                chunk = os.read(self.r, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its pipe")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(line)
            if reply.get("id") == self.n:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
        raise TimeoutError(method)

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()


srv = su.Server(TERRACE, MODEL, "-np", "4", "-c", "512", "--api-key", KEY)
profile = tempfile.mkdtemp(prefix="terrace-chromium-")
dt = None
try:
    # traffic while the page watches, so that the throughput charts have something to show
    def traffic():
        for i in range(6):
            srv.request("POST", "/v1/completions", body={"prompt": f"Story {i}:", "max_tokens": 32,
                                                         "temperature": 0},
                        headers={"Authorization": f"Bearer {KEY}"})

    dt = DevTools(profile)
    target = dt.call("Target.createTarget",
                     # the page itself comes with HTTP Basic (the key as the password), which is
                     # how a browser sends it; the page's own requests use #key= as a Bearer
                     {"url": f"http://user:{KEY}@127.0.0.1:{srv.port}/?selftest=1#key={KEY}"})["targetId"]
    sid = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    t = threading.Thread(target=traffic)
    t.start()
    probe = """JSON.stringify({
      samples: Number(document.body.dataset.samples || 0), feed: document.body.dataset.feed || "",
      selftest: document.body.dataset.selftest || "",
      charts: [...document.querySelectorAll("canvas[data-chart]")].map(c =>
        ({id: c.dataset.chart, points: Number(c.dataset.points), max: Number(c.dataset.max || 0)})),
      reply: (document.querySelector(".msg.assistant .content") || {}).textContent || "",
      model: document.getElementById("model").textContent })"""
    state = {}
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            res = dt.call("Runtime.evaluate", {"expression": probe, "returnByValue": True}, sid)
            state = json.loads(res["result"]["value"])
        except (RuntimeError, KeyError, ValueError):  # not loaded yet
            time.sleep(0.5)
            continue
        if state["selftest"] and state["samples"] >= 6 and not t.is_alive():
            break
        time.sleep(0.5)
    t.join()
    charts = {c["id"]: c for c in state.get("charts", [])}
    check(state.get("feed") == "telemetry", f"the page's feed: {state.get('feed')!r}")
    check(len(charts) == 8, f"charts: {sorted(charts)}")
    for cid, c in charts.items():
        check(c["points"] >= 3, f"chart {cid} received {c['points']} samples")
    for cid in ("toks", "agg", "rss", "kv"):
        check(charts.get(cid, {}).get("max", 0) > 0, f"chart {cid} never showed a value above 0")
    check(state.get("selftest") == "ok" and state.get("reply"), f"chat box: {state.get('selftest')!r}, "
          f"reply {state.get('reply')!r}")
    check("SmolLM2" in state.get("model", ""), f"model line: {state.get('model')!r}")
    if SHOT:
        png = dt.call("Page.captureScreenshot", {"format": "png"}, sid)["data"]
        with open(SHOT, "wb") as f:
            f.write(base64.b64decode(png))
    print(f"  page: {state['samples']} telemetry samples, 8 charts fed "
          f"(tok/s up to {charts['agg']['max']:.1f}), chat answer {state['reply'][:40]!r}")
finally:
    if dt:
        dt.close()
    shutil.rmtree(profile, ignore_errors=True)
    rc = srv.stop()
check(rc == 0, f"the server exited with {rc}")
su.done("test_serve_page")
