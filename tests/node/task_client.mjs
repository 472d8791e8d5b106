// Calls `export_tickets` as a task (TypeScript SDK) at argv[2], through the proxy the
// environment names (undici's EnvHttpProxyAgent), and prints each message it received.
import { EnvHttpProxyAgent, setGlobalDispatcher } from "undici";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

setGlobalDispatcher(new EnvHttpProxyAgent());
const client = new Client({ name: "task-client", version: "1.0.0" }, { capabilities: { tasks: {} } });
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2])));
const stream = client.experimental.tasks.callToolStream(
  { name: "export_tickets", arguments: { ticket_id: process.argv[3] ?? "T-1" } },
  undefined,
  { task: { ttl: 60000 } },
);
for await (const message of stream) {
  console.log(JSON.stringify({ type: message.type, task: message.task?.taskId, result: message.result, error: message.error?.message }));
}
await client.close();
