// The Anthropic Node SDK's stream helper against signalbox: `messages.stream()` then
// `finalMessage()`, once for text and once for a tool call. Prints what the SDK assembled as
// one JSON line (or `error` with what it raised). Run by tests/clients.rs.
//
// usage: node anthropic_node.cjs BASE_URL MODEL
'use strict';

const Anthropic = require('@anthropic-ai/sdk');

const [base, model] = process.argv.slice(2);
const headers = [];
const client = new Anthropic({
  baseURL: base,
  apiKey: 'sk-signalbox-client',
  maxRetries: 0,
  timeout: 30_000,
  // Every response's headers, for the gateway's x-llm-* ones.
  fetch: async (url, init) => {
    const r = await fetch(url, init);
    headers.push(Object.fromEntries(['x-llm-provider', 'x-llm-attempts'].map((h) => [h, r.headers.get(h)])));
    return r;
  },
});

const tools = [{
  name: 'search',
  description: 'Search the documentation.',
  input_schema: { type: 'object', properties: { query: { type: 'string' }, limit: { type: 'integer' } }, required: ['query'] },
}];

async function run(withTools) {
  const deltas = [];
  const events = [];
  const stream = client.messages.stream({
    model,
    max_tokens: 256,
    messages: [{ role: 'user', content: 'Say hello.' }],
    ...(withTools ? { tools } : {}),
  });
  stream.on('text', (d) => deltas.push(d));
  stream.on('streamEvent', (e) => events.push(e.type));
  const done = await stream.finalMessage();
  return {
    model: done.model,
    role: done.role,
    stop_reason: done.stop_reason,
    text: done.content.filter((b) => b.type === 'text').map((b) => b.text).join(''),
    tool_uses: done.content.filter((b) => b.type === 'tool_use').map((b) => ({ id: b.id, name: b.name, input: b.input })),
    usage: done.usage,
    deltas,
    events,
  };
}

(async () => {
  const out = { headers };
  try {
    out.text = await run(false);
    out.tools = await run(true);
  } catch (e) {
    out.error = { class: e.constructor.name, message: String(e.message || e), status: e.status ?? null };
  }
  console.log(JSON.stringify(out));
})();
