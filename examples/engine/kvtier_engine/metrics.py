"""A Prometheus endpoint for the engine, served from Python.

The kvtier module does not bind the C++ exporter (`kvtier::CacheCollectable`, docs/metrics.md),
so this serves, on 127.0.0.1 from a daemon thread, the Prometheus text format (0.0.4) of:
- the engine's own state: `kvtier_engine_requests{state="running"|"waiting"}`,
  `kvtier_engine_steps_total`, `kvtier_engine_tokens_total`, `kvtier_engine_preemptions_total`;
- every number of the cache's `stats()`, untyped: `kvtier_engine_cache_<stat>`, and per format
  `kvtier_engine_cache_format_<stat>{format="..."}`.
The names are not the C++ exporter's: this is the engine's view, until the module binds it.

    server = MetricsServer(engine, port=0)   # 0: any free port; server.port says which
    ...                                      # GET http://127.0.0.1:{server.port}/metrics
    server.close()

Thread-safety: scrapes read the engine's counters (Python objects, under the GIL) and call
the cache's thread-safe stats() while the engine thread runs.
"""
import http.server
import threading


def render(engine):
    """The exposition text for `engine` (an Engine)."""
    lines = ["# TYPE kvtier_engine_requests gauge",
             f'kvtier_engine_requests{{state="running"}} {len(engine.running)}',
             f'kvtier_engine_requests{{state="waiting"}} {len(engine.waiting)}']
    # A copy made in one call under the GIL: the engine thread may add requests meanwhile.
    results = list(engine.results.values())
    for name, value in (("steps", engine.steps),
                        ("tokens", sum(len(r.tokens) for r in results)),
                        ("preemptions", sum(r.preemptions for r in results))):
        lines += [f"# TYPE kvtier_engine_{name}_total counter",
                  f"kvtier_engine_{name}_total {value}"]
    cache = getattr(engine.kv, "cache", None)
    if cache is not None:
        stats = cache.stats()
        for key, value in stats.items():
            if isinstance(value, (int, float)):
                lines.append(f"kvtier_engine_cache_{key} {float(value)}")
        for fmt in stats["formats"]:
            for key, value in fmt.items():
                if key != "name":
                    lines.append(f'kvtier_engine_cache_format_{key}{{format="{fmt["name"]}"}} '
                                 f"{float(value)}")
    return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves render(engine) at /metrics on 127.0.0.1:port (0: a free port) until close()."""

    def __init__(self, engine, port=0):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = render(engine).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()
