# Serves the page and its service worker with the headers a page would use
# to claim more than its own host.
import http.server, os

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = open(os.path.join(HERE, "index.html"), "rb").read()
SW = open(os.path.join(HERE, "sw.js"), "rb").read()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        path = self.path.split("?")[0]
        if path.endswith("/sw.js"):
            body, ctype = SW, "text/javascript"
        elif path.endswith("/") or path.endswith(".html"):
            body, ctype = PAGE, "text/html; charset=utf-8"
        else:
            body, ctype = ("team-b-content " + path).encode(), "text/plain"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Service-Worker-Allowed", "/")
        self.send_header("Set-Cookie", "planted=b; Domain=localhost; Path=/")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
