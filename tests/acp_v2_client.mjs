// The official ACP TypeScript SDK's draft v2 client (@agentclientprotocol/sdk, experimental/v2)
// driving `a3s-agent acp` (tests/test_acp_v2.py runs it): a prompt whose tool call asks for
// permission, a second prompt sent while the ask waits (it steers the turn), then the answer.
// Usage: node acp_v2_client.mjs <python> <workspace>; prints what it saw as one JSON line.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { client, ndJsonStream } from "@agentclientprotocol/sdk/experimental/v2";

const [python, workspace] = process.argv.slice(2);
const agent = spawn(python, ["-m", "a3s_agent", "acp"], { cwd: workspace, stdio: ["pipe", "pipe", "inherit"] });
const stream = ndJsonStream(Writable.toWeb(agent.stdin), Readable.toWeb(agent.stdout));

const seen = { states: [], users: [], answer: "", receipts: [] };
let idle;
const ended = new Promise((resolve) => (idle = resolve));
let askAnswered;
const asked = new Promise((resolve) => (askAnswered = resolve));

const app = client()
  .onNotification("session/update", ({ params: { update } }) => {
    if (update.sessionUpdate === "state_update") {
      seen.states.push(update.state);
      if (update.state === "idle") idle(update.stopReason);
    } else if (update.sessionUpdate === "user_message") {
      seen.users.push([update.messageId, update.content.map((block) => block.text).join("")]);
    } else if (update.sessionUpdate === "agent_message_chunk") {
      seen.answer += update.content.text;
    }
  })
  .onRequest("session/request_permission", async ({ params }) => {
    seen.asked = params.subject.toolCall.name;
    const chosen = await asked; // the test's second prompt goes out first
    return { outcome: { outcome: "selected", optionId: chosen } };
  });

const timeout = setTimeout(() => {
  console.error("timed out");
  process.exit(2);
}, 60_000);

await app.connectWith(stream, async (cx) => {
  const init = await cx.request("initialize", { protocolVersion: 2, info: { name: "ts-sdk-v2", version: "1" } });
  seen.protocolVersion = init.protocolVersion;
  const { sessionId } = await cx.request("session/new", { cwd: workspace, mcpServers: [] });
  const text = (words) => ({ sessionId, prompt: [{ type: "text", text: words }] });
  seen.receipts.push((await cx.request("session/prompt", text("write a.txt"))).messageId);
  while (!seen.asked) await new Promise((resolve) => setTimeout(resolve, 20));
  seen.receipts.push((await cx.request("session/prompt", text("use tabs, not spaces"))).messageId);
  askAnswered("allow-once");
  seen.stopReason = await ended;
});
clearTimeout(timeout);
agent.kill();
console.log(JSON.stringify(seen));
