"""A stand-in engine *process* for the supervisor tests: answers /health and /server_info on the
port given, after an optional start-up delay, and leaves a child of its own running (as SGLang's
launch_server does with its scheduler) so a test can check the whole process group is stopped.

    python fake_engine_process.py PORT [--delay S] [--exit-after S] [--ignore-term] [--pids FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--exit-after", type=float, default=None)
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--pids", default=None)
    args = ap.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if args.pids:
        with open(args.pids, "w") as f:
            json.dump({"engine": os.getpid(), "child": child.pid}, f)
    if args.exit_after is not None:  # counted from the start: it may die while still starting
        threading.Timer(args.exit_after, lambda: os._exit(3)).start()
    time.sleep(args.delay)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = {"/health": {}, "/server_info": {"max_total_num_tokens": 4096, "served_model_name": "fake"}}.get(self.path)
            data = json.dumps(body if body is not None else {"error": "no such route"}).encode()
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
