-- Scenario (c): non-streaming chat completion, 100 KiB request body.
-- Usage: wrk -c 16 -d 10s -s chat-100k.lua http://127.0.0.1:PORT -- [MODEL]
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")

local model, size = "lt-model", 100 * 1024

function init(args)
  model = args[1] or model
  common.setup_post(common.chat_body(model, size, false))
end

common.setup_post(common.chat_body(model, size, false))

done = common.done
