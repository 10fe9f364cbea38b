// Scenario (e): open-loop latency at a fixed arrival rate (what oha -q does in run.sh).
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e RATE=1000 load-tests/k6/fixed-rate.js
import http from 'k6/http';
import { check } from 'k6';
import { URL, PARAMS, MODEL, DURATION, chatBody } from './lib.js';

const RATE = parseInt(__ENV.RATE || '1000', 10);
const BODY = chatBody(MODEL, 2048, false);

export const options = {
  scenarios: {
    fixed_rate: {
      executor: 'constant-arrival-rate',
      rate: RATE,
      timeUnit: '1s',
      duration: DURATION,
      preAllocatedVUs: 64,
      maxVUs: 512,
    },
  },
  thresholds: {
    http_req_failed: ['rate==0'],
    // The frontier criterion of run.sh: p99 under 10 ms with zero errors.
    'http_req_duration{expected_response:true}': ['p(99)<10'],
    // k6 drops iterations it cannot start on time: the offered rate was not sustained.
    dropped_iterations: ['count==0'],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(90)', 'p(99)', 'p(99.9)', 'max'],
};

export default function () {
  const r = http.post(URL, BODY, PARAMS);
  check(r, { 'status 200': (res) => res.status === 200 });
}
