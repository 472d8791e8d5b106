"""Extraction of calls from traffic: pure functions over request/response
bytes, no mitmproxy types, so they are testable alone and reusable."""

from offscope.proxy.extract.http import HttpRequest, HttpResponse, extract_http, parse_json_body
from offscope.proxy.extract.llm import (
    LlmResponseParser,
    LlmResult,
    llm_api_of,
    parse_request,
    parse_response,
)
from offscope.proxy.extract.mcp import ToolRegistry, mcp_messages, response_messages
from offscope.proxy.extract.sse import SseParser, parse_sse

__all__ = [
    "HttpRequest",
    "HttpResponse",
    "extract_http",
    "parse_json_body",
    "LlmResponseParser",
    "LlmResult",
    "llm_api_of",
    "parse_request",
    "parse_response",
    "ToolRegistry",
    "mcp_messages",
    "response_messages",
    "SseParser",
    "parse_sse",
]
