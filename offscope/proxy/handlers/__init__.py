"""The exchange handlers, one module per kind (see offscope/proxy/exchange.py).

Importing this package registers them. Requests are offered to them by their
`order`: an LLM API call on a declared LLM host, then MCP JSON-RPC, then
plain HTTP (which claims every request left, and hands operator routes to
the operator handler).
"""

from offscope.proxy.handlers import http, llm, mcp, operator
from offscope.proxy.handlers.mcp import decide_messages

__all__ = ["decide_messages", "http", "llm", "mcp", "operator"]
