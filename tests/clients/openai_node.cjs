// openai-node's stream helper against signalbox: `chat.completions.stream()` then
// `finalChatCompletion()`, once for text and once for a tool call. Prints what the SDK
// assembled as one JSON line (or `error` with what it raised). Run by tests/clients.rs.
//
// usage: node openai_node.cjs BASE_URL MODEL
'use strict';

const OpenAI = require('openai');

const [base, model] = process.argv.slice(2);
const headers = [];
const client = new OpenAI({
  baseURL: `${base}/v1`,
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
  type: 'function',
  function: {
    name: 'search',
    description: 'Search the documentation.',
    parameters: { type: 'object', properties: { query: { type: 'string' }, limit: { type: 'integer' } }, required: ['query'] },
  },
}];

async function run(withTools) {
  const deltas = [];
  const stream = client.chat.completions.stream({
    model,
    messages: [{ role: 'user', content: 'Say hello.' }],
    ...(withTools ? { tools } : {}),
  });
  stream.on('content', (d) => deltas.push(d));
  const done = await stream.finalChatCompletion();
  const choice = done.choices[0];
  return {
    model: done.model,
    role: choice.message.role,
    text: choice.message.content,
    finish_reason: choice.finish_reason,
    tool_calls: (choice.message.tool_calls || []).map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments })),
    deltas,
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
