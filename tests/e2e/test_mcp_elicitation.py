"""MCP 2025's server-sent `elicitation/create` is an operator channel: a FastMCP server
(the `mcp` 1.x SDK, a stateful streamable-HTTP session) asks the user to confirm during
a tool call; the SDK client's harness auto-accepts; the client posts its answer. Through
a real proxy, with assertions on what the server *received*:

- under the sentinel reply policy the server receives `decline` (the no-authority
  sentinel declines on the harness's behalf), recorded as a sentinel operator reply;
- under pass-through the `accept` reaches it, a harness approval."""

from __future__ import annotations

import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel

from tests.e2e.test_mcp import MCP_URL, client_factory
from tests.support.sidecar_kit import AsgiServer, events, of_type, report_json

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.filterwarnings("ignore:Use `streamable_http_client`:DeprecationWarning"),
]

SENTINEL_POLICY = """\
schema: offscope.policy/1
id: enforce-sentinel
mode: enforce
operator: {reply: sentinel}
"""


class Confirm(BaseModel):
    confirm: bool


def confirming_server() -> tuple[FastMCP, list[str]]:
    answers: list[str] = []
    server = FastMCP(
        "crm-tools",
        stateless_http=False,
        json_response=False,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    @server.tool()
    async def reset_password(customer_id: str, ctx: Context) -> str:
        """Reset a customer's password, once the user confirms."""
        answer = await ctx.elicit(f"Reset the password of {customer_id}?", Confirm)
        answers.append(answer.action)
        return f"reset {customer_id}" if answer.action == "accept" else f"kept: {answer.action}"

    return server, answers


async def _auto_accept(context, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"confirm": True})


@pytest.mark.parametrize(
    ("policy", "server_got", "recorded"),
    [("sentinel", "decline", "sentinel"), ("shadow", "accept", "pass-through")],
)
async def test_an_elicitation_answer_is_an_operator_reply(
    embedded, ca, tmp_path, policy, server_got, recorded
):
    server, answers = confirming_server()
    srv = AsgiServer(server.streamable_http_app(), "fastmcp-elicit").start()
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(SENTINEL_POLICY, encoding="utf-8")
    try:
        async with (
            embedded(
                policy=str(policy_file) if policy == "sentinel" else "shadow",
                routes=f"tools.acme.test=127.0.0.1:{srv.port}",
            ) as e,
            streamablehttp_client(
                MCP_URL, httpx_client_factory=client_factory(e.url("elicit-1"), ca)
            ) as (read, write, _),
            ClientSession(read, write, elicitation_callback=_auto_accept) as session,
        ):
            await session.initialize()
            result = await session.call_tool("reset_password", {"customer_id": "4411"})
            trace = events(e.trace)
    finally:
        srv.stop()

    assert answers == [server_got]  # what the server received as the user's answer
    assert result.content[0].text == ("reset 4411" if server_got == "accept" else "kept: decline")
    (op,) = of_type(trace, "operator")
    assert (op["policy"], op["provenance"]) == (recorded, "harness")
    assert op["question"] == "Reset the password of 4411?"
    assert op["channel"] == "mcp:reset_password:elicitation/create"
    (run,) = report_json(e.trace)["runs"]
    assert run["harness_approvals"] == (1 if server_got == "accept" else 0)
