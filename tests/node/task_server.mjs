// A ticket MCP server (TypeScript SDK, 2025-11-25 tasks) whose `export_tickets` tool runs
// as a task: tools/call answers with a task handle at once, the result comes later
// (tasks/result). Prints `PORT <n>`; appends each request it *received* to argv[2].
import http from "node:http";
import fs from "node:fs";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { InMemoryTaskStore } from "@modelcontextprotocol/sdk/experimental/tasks/stores/in-memory.js";
import { z } from "zod";

const received = process.argv[2];
const taskStore = new InMemoryTaskStore(); // shared: a task outlives the request that made it

function build() {
  const server = new McpServer(
    { name: "tickets", version: "1.0.0" },
    { capabilities: { tools: {}, tasks: { requests: { tools: { call: {} } }, list: {}, cancel: {} } }, taskStore },
  );
  server.experimental.tasks.registerToolTask(
    "export_tickets",
    {
      description: "Export a ticket's history (long: runs as a task).",
      inputSchema: { ticket_id: z.string() },
      annotations: { readOnlyHint: true },
      execution: { taskSupport: "required" },
    },
    {
      createTask: async (args, extra) => {
        const task = await extra.taskStore.createTask({ ttl: 60000 });
        setTimeout(() => {
          extra.taskStore.storeTaskResult(task.taskId, "completed", {
            content: [{ type: "text", text: `exported ${args.ticket_id}: 3 events` }],
          });
        }, 200);
        return { task };
      },
      getTask: async (_args, extra) => extra.taskStore.getTask(extra.taskId),
      getTaskResult: async (_args, extra) => extra.taskStore.getTaskResult(extra.taskId),
    },
  );
  return server;
}

const httpServer = http.createServer(async (req, res) => {
  let body = "";
  for await (const chunk of req) body += chunk;
  fs.appendFileSync(received, JSON.stringify({ method: req.method, body }) + "\n");
  const server = build();
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
  await server.connect(transport);
  await transport.handleRequest(req, res, body ? JSON.parse(body) : undefined);
});
httpServer.listen(0, "127.0.0.1", () => console.log(`PORT ${httpServer.address().port}`));
