-- Scenario (b): streaming chat completion ("stream": true), small body. wrk reads the whole
-- SSE response (chunked), so its latency is the full stream duration and requests/s is
-- streams/s. Per-chunk pass-through latency is measured by lib/sse_client.py.
-- Usage: wrk -c 64 -d 10s -s stream.lua http://127.0.0.1:PORT -- [MODEL]
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")

local model, size = "lt-model", 512

function init(args)
  model = args[1] or model
  common.setup_post(common.chat_body(model, size, true))
end

common.setup_post(common.chat_body(model, size, true))

done = common.done
