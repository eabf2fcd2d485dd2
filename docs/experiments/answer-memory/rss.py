"""A node's memory under 8 concurrent answers over large payloads.

Starts `campanile serve` (the binary given as the first argument) on a new SQLite file,
creates 300 schedules with 250 KiB payloads in one queue, sends 8 concurrent
`GET /v1/schedules?queue=big&limit=500` (or, with `claims` as the second argument, 300
one-offs due now and 8 concurrent claims of `max: 1000`), and prints one JSON line: each
answer's size and the process's VmRSS/VmHWM before, right after, and 2 s after. See
BENCHMARKS.md, "Memory of answers".
"""
import subprocess, sys, time, json, threading, urllib.request, tempfile, os, socket
binary = sys.argv[1]
claims = len(sys.argv) > 2 and sys.argv[2] == "claims"
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
import datetime
due = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=1)).isoformat()
for i in range(300):
    timing = ({"at": due, "misfire": {"policy": "fire_once", "max_lateness_seconds": 3600}}
              if claims else {"cron": "0 3 * * *"})
    req("POST", "/v1/schedules", {"queue": "big", **timing, "payload": {"i": i, "blob": blob}})
if claims:
    # Until the planner has made them claimable: the backlog gauge counts them.
    for _ in range(300):
        m = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        due_now = [l for l in m.splitlines() if l.startswith("campanile_due_backlog ")]
        if due_now and float(due_now[0].split()[1]) >= 300: break
        time.sleep(0.1)
before = rss()
sizes = []
def get():
    if claims:
        sizes.append(len(req("POST", "/v1/queues/big/claim", {"worker_id": "w", "max": 1000})))
    else:
        sizes.append(len(req("GET", "/v1/schedules?queue=big&limit=500")))
ts = [threading.Thread(target=get) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
after = rss()
time.sleep(2)
settled = rss()
print(json.dumps({"binary": binary, "claims": claims, "answer_bytes": sizes, "before": before, "after_peak": after, "settled": settled}))
p.terminate(); p.wait()
