"""A Prometheus endpoint for the engine, served from Python.

The kvtier module does not bind the C++ exporter (`kvtier::CacheCollectable`, docs/metrics.md),
so this serves, on 127.0.0.1 from a daemon thread, the Prometheus text format (0.0.4) of:
- the engine's own state: `kvtier_engine_requests{state="running"|"waiting"}`,
  `kvtier_engine_steps_total`, `kvtier_engine_tokens_total`, `kvtier_engine_preemptions_total`;
- every number of the cache's `stats()`, untyped: `kvtier_engine_cache_<stat>`, those of its
  host tier, remote tier and KV events as `kvtier_engine_cache_host_<stat>` (`remote_`,
  `events_`), a histogram's count and sum as `kvtier_engine_cache_<name>_count` and `_sum`, and
  per format `kvtier_engine_cache_format_<stat>{format="..."}` (each name's lines together).
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
    # The engine's running totals: counters that never go down, whatever happens to results.
    for name, value in (("steps", engine.steps), ("tokens", engine.tokens_total),
                        ("preemptions", engine.preemptions_total)):
        lines += [f"# TYPE kvtier_engine_{name}_total counter",
                  f"kvtier_engine_{name}_total {value}"]
    cache = getattr(engine.kv, "cache", None)
    if cache is not None:
        stats = cache.stats()
        lines += _numbers("kvtier_engine_cache_", stats)
        for tier in ("host", "remote", "events"):
            lines += _numbers(f"kvtier_engine_cache_{tier}_", stats.get(tier, {}))
        formats = stats["formats"]
        for key in (formats[0].keys() if formats else ()):
            if key != "name":
                lines += [f'kvtier_engine_cache_format_{key}{{format="{f["name"]}"}} '
                          f"{float(f[key])}" for f in formats]
    return "\n".join(lines) + "\n"


def _numbers(prefix, stats):
    """Lines of `stats`' numbers (booleans as 0/1), and of its histograms' count and sum."""
    lines = []
    for key, value in stats.items():
        if isinstance(value, (bool, int, float)):
            lines.append(f"{prefix}{key} {float(value)}")
        elif isinstance(value, dict) and {"count", "sum"} <= value.keys():
            lines += [f"{prefix}{key}_count {float(value['count'])}",
                      f"{prefix}{key}_sum {float(value['sum'])}"]
    return lines


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
