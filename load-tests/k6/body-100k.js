// Scenario (c): non-streaming chat completions with a 100 KiB request body, 16 connections.
//   k6 run -e BASE_URL=http://127.0.0.1:8080 load-tests/k6/body-100k.js
import http from 'k6/http';
import { check } from 'k6';
import { URL, PARAMS, MODEL, DURATION, chatBody, vus } from './lib.js';

const BODY = chatBody(MODEL, 100 * 1024, false);

export const options = {
  scenarios: {
    body_100k: { executor: 'constant-vus', vus: vus(16), duration: DURATION },
  },
  thresholds: {
    http_req_failed: ['rate<0.001'],
    'http_req_duration{expected_response:true}': ['p(50)<10', 'p(99)<50'],
    checks: ['rate>0.999'],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(90)', 'p(99)', 'p(99.9)', 'max'],
};

export default function () {
  const r = http.post(URL, BODY, PARAMS);
  check(r, {
    'status 200': (res) => res.status === 200,
  });
}
