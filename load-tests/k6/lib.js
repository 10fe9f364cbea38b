// Shared helpers for the signalbox k6 scripts (k6 cannot be installed on the project's
// machines: these scripts are syntax-checked by ../check-k6.sh and kept correct by review).
//
// Environment:
//   BASE_URL  gateway (or baseline) root, default http://127.0.0.1:8080; loopback only
//   MODEL     model name sent in the body, default lt-model
//   DURATION  e.g. 30s (default 30s)
//   VUS       virtual users = concurrent connections (each script has its own default)

export const BASE_URL = __ENV.BASE_URL || 'http://127.0.0.1:8080';
export const MODEL = __ENV.MODEL || 'lt-model';
export const DURATION = __ENV.DURATION || '30s';

// Load tests only ever target this machine.
if (!/^https?:\/\/(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?(\/|$)/.test(BASE_URL)) {
  throw new Error(`BASE_URL must be a loopback address, got ${BASE_URL}`);
}

export const URL = `${BASE_URL}/v1/chat/completions`;

export const PARAMS = {
  headers: {
    'Content-Type': 'application/json',
    Authorization: 'Bearer sk-load-test',
  },
  timeout: '30s',
};

// An OpenAI-shaped chat completion request of exactly `size` bytes (ASCII), like
// ../wrk/common.lua builds.
export function chatBody(model, size, stream) {
  const head = `{"model":"${model}","stream":${stream ? 'true' : 'false'},"max_tokens":64,` +
    '"messages":[{"role":"system","content":"You are a load test."},{"role":"user","content":"';
  const tail = '"}]}';
  const pad = Math.max(1, size - head.length - tail.length);
  const word = 'lorem ipsum dolor sit amet ';
  const filler = word.repeat(Math.floor(pad / word.length) + 1).slice(0, pad);
  return head + filler + tail;
}

export function vus(dflt) {
  return parseInt(__ENV.VUS || String(dflt), 10);
}
