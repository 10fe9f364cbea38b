-- Scenario (a), (g): non-streaming chat completion, 2 KiB request body.
-- Usage: wrk -c 64 -d 10s -s chat-2k.lua http://127.0.0.1:PORT -- [MODEL] [SIZE]
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")

local model, size = "lt-model", 2048

function init(args)
  model = args[1] or model
  size = tonumber(args[2] or size)
  common.setup_post(common.chat_body(model, size, false))
end

-- The main thread never calls init(): set a default request so that wrk's own
-- summary is meaningful even when the script is loaded without arguments.
common.setup_post(common.chat_body(model, size, false))

done = common.done
