// Scenario (a): non-streaming chat completions, 2 KiB body, 64 connections (closed loop).
//   k6 run -e BASE_URL=http://127.0.0.1:8080 load-tests/k6/nonstream.js
import http from 'k6/http';
import { check } from 'k6';
import { BASE_URL, URL, PARAMS, MODEL, DURATION, chatBody, vus } from './lib.js';

const BODY = chatBody(MODEL, 2048, false);

export const options = {
  scenarios: {
    nonstream_2k: { executor: 'constant-vus', vus: vus(64), duration: DURATION },
  },
  thresholds: {
    http_req_failed: ['rate<0.001'],
    'http_req_duration{expected_response:true}': ['p(50)<5', 'p(99)<25', 'p(99.9)<50'],
    checks: ['rate>0.999'],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'p(90)', 'p(99)', 'p(99.9)', 'max'],
};

export function setup() {
  const r = http.post(URL, BODY, PARAMS);
  if (r.status !== 200) {
    throw new Error(`sanity request to ${BASE_URL} answered ${r.status}`);
  }
}

export default function () {
  const r = http.post(URL, BODY, PARAMS);
  check(r, {
    'status 200': (res) => res.status === 200,
    'a chat completion': (res) => res.body !== null && res.body.indexOf('"choices"') >= 0,
  });
}
