import http.client, json, sys, threading, time
port, key, n, threads = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), 4
zones = ["UTC", "Europe/Paris", "America/New_York", "Asia/Tokyo"]
def work(t):
    c = http.client.HTTPConnection("127.0.0.1", port)
    for i in range(t, n, threads):
        body = json.dumps({"queue": f"q{i % 10}", "cron": f"{i % 60} {i % 24} * * *", "timezone": zones[i % 4]})
        c.request("POST", "/v1/schedules", body, {"authorization": f"Bearer {key}", "content-type": "application/json"})
        r = c.getresponse(); r.read()
        if r.status != 201:
            print("fail", r.status); return
t0 = time.time()
ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
print("created", n, "in", round(time.time() - t0, 1), "s")
