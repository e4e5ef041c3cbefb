"""A tiny OTLP/HTTP traces receiver for tests: an HTTP server on a loopback port, in a thread of
the test, that decodes each `POST /v1/traces` (protobuf, `opentelemetry-proto`) and keeps its
spans; and a printer of what it received as a tree."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@attrs.frozen
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    kind: int
    attributes: dict[str, Any]
    status_code: int
    service_name: str
    start: int


@attrs.define
class Receiver:
    url: str  # the base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it
    spans: list[ReceivedSpan] = attrs.field(factory=list)
    paths: list[str] = attrs.field(factory=list)
    lock: threading.Lock = attrs.field(factory=threading.Lock)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind is not None else None


def _spans(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        status_code=span.status.code,
                        service_name=str(resource.get("service.name")),
                        start=span.start_time_unix_nano,
                    )
                )
    return out


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver listening until the block ends."""
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802  (the http.server name)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with receiver.lock:
                receiver.paths.append(self.path)
                receiver.spans.extend(_spans(request))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test output stays quiet: http.server logs every request to stderr

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


_KEYS = (
    "gen_ai.agent.id",
    "gen_ai.agent.name",
    "gen_ai.tool.call.id",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.response.finish_reasons",
    "subagents.turn",
    "subagents.turn.end_reason",
)


def span_tree(spans: list[ReceivedSpan], *, tags: dict[str, str] | None = None) -> str:
    """The spans as an indented tree per trace, children by start time; `tags` adds a note after
    a span id (which process sent it, say)."""
    by_id = {s.span_id: s for s in spans}
    children: dict[str, list[ReceivedSpan]] = {}
    roots = []
    for span in sorted(spans, key=lambda s: s.start):
        if span.parent_span_id and span.parent_span_id in by_id:
            children.setdefault(span.parent_span_id, []).append(span)
        else:
            roots.append(span)
    lines: list[str] = []

    def walk(span: ReceivedSpan, depth: int) -> None:
        shown = ", ".join(f"{k}={span.attributes[k]}" for k in _KEYS if k in span.attributes)
        tag = f" [{tags[span.span_id]}]" if tags and span.span_id in tags else ""
        status = " ERROR" if span.status_code == 2 else ""
        lines.append(f"{'  ' * depth}{span.name}{status}  ({shown}){tag}")
        for child in children.get(span.span_id, []):
            walk(child, depth + 1)

    for root in roots:
        missing = f" (parent {root.parent_span_id} not received)" if root.parent_span_id else ""
        lines.append(f"trace {root.trace_id}{missing}")
        walk(root, 1)
    return "\n".join(lines) + "\n"
