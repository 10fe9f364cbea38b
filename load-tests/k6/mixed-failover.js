// Scenario (d): mixed failover. The gateway's model lt-mix-N lists three providers in a rotated
// order, one of which answers 503 (see run.sh's generated config), so one request in three
// pays one failover hop. The caller must never see the 503.
//   k6 run -e BASE_URL=http://127.0.0.1:8080 load-tests/k6/mixed-failover.js
import http from 'k6/http';
import { check } from 'k6';
import { Counter, Rate, Trend } from 'k6/metrics';
import { URL, PARAMS, DURATION, chatBody, vus } from './lib.js';

const MODELS = (__ENV.MODELS || 'lt-mix-0,lt-mix-1,lt-mix-2').split(',');
const BODIES = MODELS.map((m) => chatBody(m, 2048, false));

const attempts = new Trend('llm_attempts');
const fallbacks = new Rate('llm_fallback');
const byRoute = new Counter('llm_served');

export const options = {
  scenarios: {
    mixed: { executor: 'constant-vus', vus: vus(64), duration: DURATION },
  },
  thresholds: {
    // No failure reaches the caller.
    http_req_failed: ['rate==0'],
    // One request in three fails over once: about 1.33 upstream calls per request.
    llm_attempts: ['avg<1.5', 'max<=2'],
    llm_fallback: ['rate<0.4'],
    'http_req_duration{expected_response:true}': ['p(50)<5', 'p(99)<30'],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(90)', 'p(99)', 'p(99.9)', 'max'],
};

export default function () {
  const i = (__VU + __ITER) % BODIES.length;
  const r = http.post(URL, BODIES[i], PARAMS);
  const n = parseInt(r.headers['X-Llm-Attempts'] || '0', 10);
  if (n > 0) {
    attempts.add(n);
  }
  fallbacks.add(r.headers['X-Llm-Fallback'] === 'true');
  byRoute.add(1, { provider: r.headers['X-Llm-Provider'] || 'none' });
  check(r, {
    'status 200': (res) => res.status === 200,
    'served by a healthy provider': (res) => res.headers['X-Llm-Provider'] !== 'fail-503',
  });
}
