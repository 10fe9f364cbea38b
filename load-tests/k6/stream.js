// Scenario (b): streaming chat completions ("stream": true) through the proxy.
// k6's HTTP client reads the whole response before returning, so per-chunk pass-through
// latency cannot be measured here (lib/sse_client.py does that); what k6 gives is the time to
// the response header (http_req_waiting = TTFB) and the whole stream's duration.
//   k6 run -e BASE_URL=http://127.0.0.1:8080 load-tests/k6/stream.js
import http from 'k6/http';
import { check } from 'k6';
import { Counter, Trend } from 'k6/metrics';
import { URL, PARAMS, MODEL, DURATION, chatBody, vus } from './lib.js';

const BODY = chatBody(MODEL, 512, true);
const sseEvents = new Counter('sse_events');
const streamTtfb = new Trend('stream_ttfb', true);

export const options = {
  scenarios: {
    stream: { executor: 'constant-vus', vus: vus(16), duration: DURATION },
  },
  thresholds: {
    http_req_failed: ['rate<0.001'],
    stream_ttfb: ['p(50)<5', 'p(99)<25'],
    'checks{check:stream ends with DONE}': ['rate>0.999'],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(90)', 'p(99)', 'p(99.9)', 'max'],
};

export default function () {
  const r = http.post(URL, BODY, Object.assign({}, PARAMS, {
    headers: Object.assign({}, PARAMS.headers, { Accept: 'text/event-stream' }),
  }));
  streamTtfb.add(r.timings.waiting);
  const body = r.body || '';
  const events = body.split('\n\n').filter((e) => e.indexOf('data:') === 0);
  sseEvents.add(events.length);
  check(r, {
    'status 200': (res) => res.status === 200,
    'content-type text/event-stream': (res) =>
      (res.headers['Content-Type'] || '').indexOf('text/event-stream') === 0,
    'stream ends with DONE': () => body.trimEnd().endsWith('data: [DONE]'),
  });
}
