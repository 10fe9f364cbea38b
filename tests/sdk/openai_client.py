"""Call signalbox with the official OpenAI Python SDK; print what the SDK saw as one JSON object.

usage: openai_client.py BASE_URL CASE MODEL

  BASE_URL  the gateway, http://HOST:PORT (the SDK calls BASE_URL/v1/chat/completions)
  CASE      chat | chat_tools | stream | stream_tools
  MODEL     the model name sent

The object: the gateway's response headers, the answer as the SDK parsed it (model, text,
finish_reason, tool_calls with id/name/arguments, usage), for streams also the content and
tool-argument deltas as they came; and `error` (class, message, status, body) if the SDK raised,
with whatever was received before. Run by tests/sdk.rs.
"""

import json
import sys

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the documentation.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    }
]
HEADERS = ("x-llm-provider", "x-llm-attempts", "x-llm-fallback", "x-routed-via", "content-type")


def gateway_headers(headers):
    return {name: headers.get(name) for name in HEADERS}


def describe(completion, out):
    """The parts of a (possibly accumulated) chat completion the tests look at."""
    out["id"] = completion.id
    out["model"] = completion.model
    out["usage"] = completion.usage.model_dump() if completion.usage else None
    out["choices"] = len(completion.choices)
    choice = completion.choices[0]
    out["finish_reason"] = choice.finish_reason
    out["text"] = choice.message.content
    out["tool_calls"] = [
        {"id": c.id, "type": c.type, "name": c.function.name, "arguments": c.function.arguments}
        for c in choice.message.tool_calls or []
    ]


def chat(client, params, out):
    raw = client.chat.completions.with_raw_response.create(**params)
    out["status"] = raw.status_code
    out["headers"] = gateway_headers(raw.headers)
    describe(raw.parse(), out)


def stream(client, params, out):
    raw = client.chat.completions.with_raw_response.create(
        stream=True, stream_options={"include_usage": True}, **params
    )
    out["status"] = raw.status_code
    out["headers"] = gateway_headers(raw.headers)
    state = ChatCompletionStreamState()  # the SDK's own accumulator: it assembles tool calls
    for chunk in raw.parse():
        out["chunks"] += 1
        out["chunk_models"].append(chunk.model)
        for choice in chunk.choices:
            if choice.delta.content:
                out["deltas"].append(choice.delta.content)
            for call in choice.delta.tool_calls or []:
                if call.function and call.function.arguments:
                    out["argument_deltas"].append(call.function.arguments)
        list(state.handle_chunk(chunk))
    describe(state.get_final_completion(), out)


def main():
    base_url, case, model = sys.argv[1:4]
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-sdk-test", max_retries=0, timeout=30)
    params = {"model": model, "messages": [{"role": "user", "content": "Say hello."}]}
    if case.endswith("_tools"):
        params["tools"] = TOOLS
    out = {"case": case, "error": None, "headers": {}, "chunks": 0, "chunk_models": [],
           "deltas": [], "argument_deltas": []}
    try:
        if case in ("chat", "chat_tools"):
            chat(client, params, out)
        elif case in ("stream", "stream_tools"):
            stream(client, params, out)
        else:
            sys.exit(f"unknown case {case!r}")
    except Exception as e:  # what the SDK raised is the result
        response = getattr(e, "response", None)
        if response is not None and not out["headers"]:
            out["headers"] = gateway_headers(response.headers)
        out["error"] = {
            "class": type(e).__name__,
            "api_error": isinstance(e, openai.APIError),
            "message": str(e),
            "status": getattr(e, "status_code", None),
            "body": getattr(e, "body", None),
        }
    out["streamed_text"] = "".join(out["deltas"])
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
