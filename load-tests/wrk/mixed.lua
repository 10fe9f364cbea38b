-- Scenario (d): mixed failover. Requests rotate over the models given as arguments
-- (default lt-mix-0, lt-mix-1, lt-mix-2). The runner's signalbox config lists the same three
-- providers in a rotated order for each model, one of which answers 503, so one request in
-- three pays a failover hop. Plain proxies (nginx, HAProxy) ignore the model and get the same
-- mix from round-robin with retry-on-503. 2 KiB bodies.
-- Usage: wrk -c 64 -d 10s -s mixed.lua http://127.0.0.1:PORT -- [MODEL ...]
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")

local reqs, n = {}, 0

function init(args)
  local models = {}
  for i = 1, #args do models[#models + 1] = args[i] end
  if #models == 0 then models = { "lt-mix-0", "lt-mix-1", "lt-mix-2" } end
  local headers = { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer sk-load-test" }
  for i, m in ipairs(models) do
    reqs[i] = wrk.format("POST", "/v1/chat/completions", headers, common.chat_body(m, 2048, false))
  end
  -- Start each thread at a different offset so the mix is even across threads.
  n = math.random(#reqs) - 1
end

function request()
  n = n + 1
  return reqs[(n - 1) % #reqs + 1]
end

done = common.done
