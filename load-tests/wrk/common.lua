-- Shared by the load-tests wrk scripts (loaded with dofile from the script's own directory).
--
-- chat_body(model, size, stream): an OpenAI-shaped chat-completion request body of exactly
--   `size` bytes (padded in the user message; never smaller than the JSON skeleton).
-- setup_post(body): sets wrk.method/body/headers for a POST /v1/chat/completions.
-- done(): prints one line "WRK_JSON {...}" that the runner parses instead of scraping text:
--   duration, requests, bytes, errors (connect/read/write/status/timeout; status = non-2xx/3xx)
--   and latency (µs) min/max/mean/stdev and percentiles 50/75/90/99/99.9/99.99.

local M = {}

function M.chat_body(model, size, stream)
  local head = '{"model":"' .. model .. '","stream":' .. (stream and 'true' or 'false') ..
    ',"max_tokens":64,"messages":[{"role":"system","content":"You are a load test."},' ..
    '{"role":"user","content":"'
  local tail = '"}]}'
  local pad = size - #head - #tail
  if pad < 1 then pad = 1 end
  -- Printable, JSON-safe filler that looks a little like text.
  local word = "lorem ipsum dolor sit amet "
  local filler = string.rep(word, math.floor(pad / #word) + 1):sub(1, pad)
  return head .. filler .. tail
end

function M.setup_post(body)
  wrk.method = "POST"
  wrk.path = "/v1/chat/completions"
  wrk.body = body
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer sk-load-test"
end

function M.done(summary, latency, requests)
  local e = summary.errors
  local ps = {}
  for _, q in ipairs({ 50, 75, 90, 99, 99.9, 99.99 }) do
    ps[#ps + 1] = string.format('"%s":%d', tostring(q), latency:percentile(q))
  end
  io.write(string.format(
    'WRK_JSON {"duration_us":%d,"requests":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"max":%d,"mean":%.1f,"stdev":%.1f,"p":{%s}}}\n',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.max, latency.mean, latency.stdev, table.concat(ps, ",")))
end

return M
