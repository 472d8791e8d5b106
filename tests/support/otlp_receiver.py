"""A real OTLP/HTTP trace receiver on loopback: decodes `ExportTraceServiceRequest`
protobuf bodies with the `opentelemetry-proto` package, as a collector would."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    status_code: int
    status_message: str
    resource: dict[str, Any]
    scope: str


@dataclass
class OtlpReceiver:
    """POST /v1/traces -> decoded spans. `delay` makes it a slow collector."""

    delay: float = 0.0
    spans: list[Span] = field(default_factory=list)
    requests: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if outer.delay:
                    time.sleep(outer.delay)
                if (
                    self.path != "/v1/traces"
                    or self.headers.get("content-type") != "application/x-protobuf"
                ):
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                outer._add(request)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        decoded = []
        for rs in request.resource_spans:
            resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    decoded.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={kv.key: value(kv.value) for kv in s.attributes},
                            events=[
                                (
                                    e.name,
                                    e.time_unix_nano,
                                    {kv.key: value(kv.value) for kv in e.attributes},
                                )
                                for e in s.events
                            ],
                            status_code=s.status.code,
                            status_message=s.status.message,
                            resource=resource,
                            scope=ss.scope.name,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(decoded)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
