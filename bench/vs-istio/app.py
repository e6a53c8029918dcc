#!/usr/bin/env python3
# app.py PORT BYTES: an application's /metrics on 127.0.0.1:PORT, a text
# exposition of about BYTES, as Micrometer renders a busy JVM service's
# request histogram (a series set per URI), for bench-vs-istio's
# MEM_APP_BYTES (#36): both agents merge it into their scrape.
import http.server, sys
port, size = int(sys.argv[1]), int(sys.argv[2])
les = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "+Inf"]
out = ["# HELP jvm_threads_live_threads The current number of live threads\n# TYPE jvm_threads_live_threads gauge\njvm_threads_live_threads 42.0\n",
       "# HELP http_server_requests_seconds Duration of HTTP server request handling\n# TYPE http_server_requests_seconds histogram\n"]
n, i = sum(map(len, out)), 0
while n < size:
    lbl = 'exception="None",method="GET",outcome="SUCCESS",status="200",uri="/api/v1/items/%d"' % i
    s = "".join('http_server_requests_seconds_bucket{%s,le="%s"} %d\n' % (lbl, le, k * 3) for k, le in enumerate(les))
    s += "http_server_requests_seconds_count{%s} 36\nhttp_server_requests_seconds_sum{%s} 1.25\n" % (lbl, lbl)
    out.append(s); n += len(s); i += 1
body = "".join(out).encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
