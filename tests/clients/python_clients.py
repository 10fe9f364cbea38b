"""LiteLLM and LangChain as clients of signalbox; prints what each saw as one JSON line.

usage: python_clients.py CLIENT BASE_URL MODEL

  CLIENT  litellm-openai | litellm-anthropic | langchain-openai | langchain-anthropic
          (the library, and the dialect it speaks to the gateway: chat completions or messages)

Each makes one plain call and one stream; the object holds the text of both, the streamed
pieces, the model the answer names and usage where the library reports it, or `error` (class,
message) if it raised. Run by tests/clients.rs.
"""

import json
import sys

KEY = "sk-signalbox-client"
PROMPT = "Say hello."


def litellm_calls(provider, base, model):
    import litellm

    litellm.telemetry = False
    # openai/: BASE/v1/chat/completions; anthropic/: BASE/v1/messages.
    api_base = f"{base}/v1" if provider == "openai" else base
    kw = dict(
        model=f"{provider}/{model}",
        api_base=api_base,
        api_key=KEY,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=256,
        num_retries=0,
        timeout=30,
    )
    r = litellm.completion(**kw)
    out = {
        "text": r.choices[0].message.content,
        "model": r.model,
        "finish_reason": r.choices[0].finish_reason,
        "usage": {"completion_tokens": r.usage.completion_tokens},
    }
    pieces = []
    for chunk in litellm.completion(stream=True, **kw):
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
    out["pieces"] = pieces
    out["streamed_text"] = "".join(pieces)
    return out


def langchain_calls(provider, base, model):
    if provider == "openai":
        from langchain_openai import ChatOpenAI

        llm = ChatOpenAI(
            model=model, base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=30
        )
    else:
        from langchain_anthropic import ChatAnthropic

        llm = ChatAnthropic(
            model=model,
            base_url=base,
            api_key=KEY,
            max_retries=0,
            timeout=30,
            max_tokens=256,
        )
    r = llm.invoke(PROMPT)
    out = {
        "text": r.text if isinstance(r.text, str) else r.text(),
        "model": r.response_metadata.get("model_name") or r.response_metadata.get("model"),
        "usage": r.usage_metadata,
    }
    pieces = []
    for chunk in llm.stream(PROMPT):
        text = chunk.text if isinstance(chunk.text, str) else chunk.text()
        if text:
            pieces.append(text)
    out["pieces"] = pieces
    out["streamed_text"] = "".join(pieces)
    return out


def main():
    client, base, model = sys.argv[1:4]
    library, provider = client.split("-", 1)
    out = {}
    try:
        calls = litellm_calls if library == "litellm" else langchain_calls
        out.update(calls(provider, base, model))
    except Exception as e:  # what the library raised is the test's finding
        out["error"] = {"class": type(e).__name__, "message": str(e)}
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
