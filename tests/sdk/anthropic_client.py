"""Call signalbox with the official Anthropic Python SDK; print what the SDK saw as one JSON object.

usage: anthropic_client.py BASE_URL CASE MODEL

  BASE_URL  the gateway, http://HOST:PORT (the SDK calls BASE_URL/v1/messages)
  CASE      message | message_tools | stream | stream_tools
  MODEL     the model name sent

The object: the gateway's response headers, the message as the SDK parsed it (model, text,
stop_reason, tool_calls with id/name/input, usage), for streams also the event types, text and
input-JSON deltas as they came; and `error` (class, message, status, body) if the SDK raised,
with whatever was received before. Run by tests/sdk.rs.
"""

import json
import sys

import anthropic

TOOLS = [
    {
        "name": "search",
        "description": "Search the documentation.",
        "input_schema": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    }
]
HEADERS = ("x-llm-provider", "x-llm-attempts", "x-llm-fallback", "x-routed-via", "content-type")


def gateway_headers(headers):
    return {name: headers.get(name) for name in HEADERS}


def describe(message, out):
    """The parts of a (possibly accumulated) message the tests look at."""
    out["id"] = message.id
    out["model"] = message.model
    out["stop_reason"] = message.stop_reason
    out["usage"] = {"input_tokens": message.usage.input_tokens, "output_tokens": message.usage.output_tokens}
    out["blocks"] = [block.type for block in message.content]
    out["text"] = "".join(block.text for block in message.content if block.type == "text")
    out["tool_calls"] = [
        {"id": block.id, "name": block.name, "input": block.input}
        for block in message.content
        if block.type == "tool_use"
    ]


def message(client, params, out):
    raw = client.messages.with_raw_response.create(**params)
    out["status"] = raw.status_code
    out["headers"] = gateway_headers(raw.headers)
    describe(raw.parse(), out)


def stream(client, params, out):
    with client.messages.stream(**params) as s:  # the SDK's helper: it assembles tool inputs
        out["status"] = s.response.status_code
        out["headers"] = gateway_headers(s.response.headers)
        for event in s:
            out["events"].append(event.type)
            if event.type == "message_start":
                out["start_model"] = event.message.model
            elif event.type == "text" and event.text:
                out["deltas"].append(event.text)
            elif event.type == "input_json" and event.partial_json:
                out["argument_deltas"].append(event.partial_json)
        describe(s.get_final_message(), out)


def main():
    base_url, case, model = sys.argv[1:4]
    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-sdk-test", max_retries=0, timeout=30)
    params = {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": "Say hello."}]}
    if case.endswith("_tools"):
        params["tools"] = TOOLS
    out = {"case": case, "error": None, "headers": {}, "events": [], "deltas": [], "argument_deltas": []}
    try:
        if case in ("message", "message_tools"):
            message(client, params, out)
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
            "api_error": isinstance(e, anthropic.APIError),
            "status_error": isinstance(e, anthropic.APIStatusError),
            "message": str(e),
            "status": getattr(e, "status_code", None),
            "body": getattr(e, "body", None),
        }
    out["streamed_text"] = "".join(out["deltas"])
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
