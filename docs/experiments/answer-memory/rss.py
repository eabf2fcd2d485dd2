"""A node's memory under 8 concurrent list answers over large payloads.

Starts `campanile serve` (the binary given as the first argument) on a new SQLite file,
creates 300 schedules with 250 KiB payloads in one queue, sends 8 concurrent
`GET /v1/schedules?queue=big&limit=500`, and prints one JSON line: each answer's size and the
process's VmRSS/VmHWM before, right after, and 2 s after. See BENCHMARKS.md, "Memory of list
answers".
"""
import subprocess, sys, time, json, threading, urllib.request, tempfile, os, socket
binary = sys.argv[1]
d = tempfile.mkdtemp()
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
p = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--database", f"{d}/r.db"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
key = None
for line in p.stdout:
    if line.strip().startswith("cmp_"):
        key = line.strip(); break
base = f"http://127.0.0.1:{port}"
def req(method, path, body=None):
    r = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                               headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=120) as resp:
        return resp.read()
for _ in range(200):
    try:
        urllib.request.urlopen(base + "/readyz", timeout=2); break
    except Exception: time.sleep(0.1)
def rss():
    st = open(f"/proc/{p.pid}/status").read()
    return {k: v for k, v in (l.split(":", 1) for l in st.splitlines()) if k in ("VmRSS", "VmHWM")}
blob = "x" * (250 * 1024)
for i in range(300):
    req("POST", "/v1/schedules", {"queue": "big", "cron": "0 3 * * *", "payload": {"i": i, "blob": blob}})
before = rss()
sizes = []
def get():
    sizes.append(len(req("GET", "/v1/schedules?queue=big&limit=500")))
ts = [threading.Thread(target=get) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
after = rss()
time.sleep(2)
settled = rss()
print(json.dumps({"binary": binary, "answer_bytes": sizes, "before": before, "after_peak": after, "settled": settled}))
p.terminate(); p.wait()
