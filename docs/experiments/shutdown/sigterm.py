"""How long `campanile serve` takes to exit on SIGTERM while two clients hold half-sent
requests (a head without its blank line, a body that stops after one byte of 100).

    python3 docs/experiments/shutdown/sigterm.py <campanile binary> [serve flags...]
"""
import subprocess, sys, time, socket, tempfile, urllib.request
binary=sys.argv[1]; extra=sys.argv[2:]
d=tempfile.mkdtemp(); s=socket.socket(); s.bind(("127.0.0.1",0)); port=s.getsockname()[1]; s.close()
p=subprocess.Popen([binary,"serve","--listen",f"127.0.0.1:{port}","--database",f"{d}/s.db"]+extra,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
for _ in range(300):
    try: urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz",timeout=2); break
    except Exception: time.sleep(0.1)
c=socket.create_connection(("127.0.0.1",port)); c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
c2=socket.create_connection(("127.0.0.1",port)); c2.sendall(b"POST /v1/schedules HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
time.sleep(0.5)
t=time.time(); p.terminate()
try:
    p.wait(timeout=45); print(binary, extra, "exited after %.1f s" % (time.time()-t), "status", p.returncode)
except subprocess.TimeoutExpired:
    print(binary, extra, "still running 45 s after SIGTERM"); p.kill()
