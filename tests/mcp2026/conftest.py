"""The peers' fixtures (defined beside the first tests that used them), for every module here."""

from tests.mcp2026.test_stateless_mcp import peer_server, tickets_proxy  # noqa: F401
