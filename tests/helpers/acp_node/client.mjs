// A test client for `subagents acp` on the official ACP TypeScript SDK (its unstable v1 entry,
// which has subagent sessions). It opts in with `clientCapabilities.subagents: {}`, validates
// every message the agent sends against the SDK's own zod schema (and the SDK validates each
// `session/update` again as it routes it), cancels one child by its session id, then loads the
// session in a second agent process, and writes what it saw as a JSON transcript.
//
// Usage: node client.mjs CONFIG.json, where the config names
//   agent: the agent's argv; cwd; prompt; cancel_title: the title of the child to cancel (once
//   a tool call of it completed);
//   children: how many children to wait for, all idle; done_text: what the root says last;
//   transcript: where to write; stderr: the agent's stderr file; timeout_ms: a hang guard.
// Exit status: 0 when every message was valid and the run finished, 1 otherwise (the transcript
// says why).

import { spawn } from "node:child_process";
import { openSync, readFileSync, writeFileSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import { client, methods, ndJsonStream } from "@agentclientprotocol/sdk/unstable";

const zod = await import(new URL("./schema/zod.gen.js", import.meta.resolve("@agentclientprotocol/sdk/unstable")));

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const transcript = { phases: [], invalid: [], error: null };

const REQUESTS = { "session/request_permission": zod.zRequestPermissionRequest };
const NOTIFICATIONS = { "session/update": zod.zSessionNotification };
const RESPONSES = {
  initialize: zod.zInitializeResponse,
  "session/new": zod.zNewSessionResponse,
  "session/load": zod.zLoadSessionResponse,
  "session/prompt": zod.zPromptResponse,
  "session/close": zod.zCloseSessionResponse,
};
// The schema lets unknown state and stop-reason strings through (for later protocol versions);
// this agent must send only the ones the schema names.
const STATES = new Set(["running", "idle", "requires_action", "unknown"]);
const STOP_REASONS = new Set(["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled", "error"]);

function problems(message, sent) {
  const out = [];
  if (message.jsonrpc !== "2.0") out.push("jsonrpc is not 2.0");
  let schema, value;
  if ("method" in message) {
    schema = ("id" in message ? REQUESTS : NOTIFICATIONS)[message.method];
    value = message.params;
    if (!schema) out.push(`unexpected method ${message.method}`);
  } else if ("error" in message) {
    const e = message.error;
    if (!Number.isInteger(e?.code) || typeof e?.message !== "string") out.push("malformed error object");
  } else {
    const method = sent.get(message.id);
    schema = RESPONSES[method];
    value = message.result;
    if (!schema) out.push(`a response to an unknown request ${message.id} (${method})`);
  }
  if (schema) {
    const parsed = schema.safeParse(value);
    if (!parsed.success) out.push(parsed.error.message);
  }
  const update = message.method === "session/update" ? message.params?.update : undefined;
  if (update?.sessionUpdate === "subagent_update" && update.state != null) {
    if (!STATES.has(update.state.state)) out.push(`unknown subagent state ${update.state.state}`);
    if (update.state.state === "idle" && !STOP_REASONS.has(update.state.stopReason)) {
      out.push(`unknown stop reason ${update.state.stopReason}`);
    }
  }
  return out;
}

// What the client knows, from the messages as they arrive (waiters re-check on each one).
class View {
  constructor() {
    this.children = new Map(); // child session id -> {parent, title, state}
    this.rootText = "";
    this.toolsDone = new Set(); // sessions with a completed tool call (their turn is under way)
    this.waiters = new Set();
  }
  see(message, root) {
    const params = message.method === "session/update" ? message.params : undefined;
    const update = params?.update;
    if (update?.sessionUpdate === "subagent_update") {
      const child = this.children.get(update.sessionId) ?? { parent: params.sessionId };
      if ("title" in update) child.title = update.title;
      if (update.state != null) child.state = update.state.state;
      this.children.set(update.sessionId, child);
    } else if (update?.sessionUpdate === "tool_call_update" && update.status === "completed") {
      this.toolsDone.add(params.sessionId);
    } else if (update?.sessionUpdate === "agent_message_chunk" && params.sessionId === root()) {
      this.rootText += update.content?.text ?? "";
    }
    for (const waiter of [...this.waiters]) waiter();
  }
  until(predicate) {
    return new Promise((resolve) => {
      const check = () => {
        if (predicate()) {
          this.waiters.delete(check);
          resolve();
        }
      };
      this.waiters.add(check);
      check();
    });
  }
}

async function phase(name, body) {
  const record = { name, messages: [] };
  transcript.phases.push(record);
  const view = new View();
  const sent = new Map();
  let root = null;
  const agent = spawn(config.agent[0], config.agent.slice(1), {
    cwd: config.cwd,
    stdio: ["pipe", "pipe", openSync(config.stderr, "a")],
  });
  const exited = new Promise((resolve) => agent.on("exit", (code, signal) => resolve({ code, signal })));
  const wire = ndJsonStream(Writable.toWeb(agent.stdin), Readable.toWeb(agent.stdout));
  const incoming = new TransformStream({
    transform(message, controller) {
      const found = problems(message, sent);
      record.messages.push({ dir: "in", message });
      if (found.length) transcript.invalid.push({ phase: name, message, problems: found });
      view.see(message, () => root);
      controller.enqueue(message);
    },
  });
  const outgoing = new TransformStream({
    transform(message, controller) {
      if ("method" in message && "id" in message) sent.set(message.id, message.method);
      record.messages.push({ dir: "out", message });
      controller.enqueue(message);
    },
  });
  void outgoing.readable.pipeTo(wire.writable).catch(() => {});
  const stream = { readable: wire.readable.pipeThrough(incoming), writable: outgoing.writable };
  const app = client({ name: "subagents-test-client" })
    .onNotification(methods.client.session.update, () => {})
    .onRequest(methods.client.session.requestPermission, () => ({
      outcome: { outcome: "selected", optionId: "allow_once" },
    }));
  await app.connectWith(stream, async (ctx) => {
    await ctx.request(methods.agent.initialize, {
      protocolVersion: 1,
      clientCapabilities: { subagents: {} },
      clientInfo: { name: "subagents-test-client", version: "1" },
    });
    await body(ctx, view, (id) => (root = id), record);
  });
  agent.stdin.end();
  record.exit = await exited;
}

const timer = setTimeout(() => {
  transcript.error = `timed out after ${config.timeout_ms} ms`;
  writeFileSync(config.transcript, JSON.stringify(transcript, null, 1));
  process.exit(1);
}, config.timeout_ms);

try {
  let sessionId;
  await phase("live", async (ctx, view, setRoot, record) => {
    ({ sessionId } = await ctx.request(methods.agent.session.new, { cwd: config.cwd, mcpServers: [] }));
    setRoot(sessionId);
    const prompt = ctx.request(methods.agent.session.prompt, {
      sessionId,
      prompt: [{ type: "text", text: config.prompt }],
    });
    // Cancelled once its turn is under way (a tool call of it completed): a cancel before its
    // turn began would find nothing running.
    const victim = () =>
      [...view.children].find(([id, c]) => c.title === config.cancel_title && view.toolsDone.has(id))?.[0];
    await view.until(() => victim() !== undefined);
    record.cancelled = victim();
    await ctx.notify(methods.agent.session.cancel, { sessionId: record.cancelled });
    record.promptResponse = await prompt;
    await view.until(
      () =>
        view.children.size >= config.children &&
        [...view.children.values()].every((c) => c.state === "idle") &&
        view.rootText.includes(config.done_text),
    );
  });
  await phase("load", async (ctx) => {
    await ctx.request(methods.agent.session.load, { sessionId, cwd: config.cwd, mcpServers: [] });
  });
  transcript.sessionId = sessionId;
} catch (error) {
  transcript.error = String(error?.stack ?? error);
}
clearTimeout(timer);
writeFileSync(config.transcript, JSON.stringify(transcript, null, 1));
process.exit(transcript.error || transcript.invalid.length ? 1 : 0);
