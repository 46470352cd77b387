"""Compaction over real HTTP: the openai SDK against a server on 127.0.0.1; the summary call, the
byte-identical prefix and cached-token pricing as the provider sees and reports them."""

from __future__ import annotations

import json
from typing import Any

from fake_openai_server import FakeOpenAIServer, chat_completion, tool_call

from tether import Agent, Limits, tool
from tether.context import Compaction
from tether.models._openai_compat import OpenAICompatModel
from tether.models._pricing import Pricing


@tool(max_result_chars=50_000)
def search_logs(service: str) -> str:
    """Search one service's logs."""
    rows = [f"2026-11-30T03:{i:02d}:10Z INFO {service} request ok latency_ms={i * 3}" for i in range(80)]
    rows.insert(17, f"2026-11-30T03:17:44Z ERROR {service} pool exhausted on host db-{len(service)}")
    return "\n".join(rows)


SERVICES = ["gateway", "auth", "orders", "payments", "inventory", "cart"]


def test_compaction_over_http() -> None:
    main_calls: list[dict[str, Any]] = []

    def responder(request) -> dict[str, Any]:
        body = request.body
        if body["messages"][0]["content"].startswith("You compact"):
            return chat_completion("- searched logs; pool errors seen", prompt_tokens=400, model="gpt-4o-mini")
        main_calls.append(body)
        n = len(main_calls)
        reply = (chat_completion(None, [tool_call("search_logs", {"service": SERVICES[n - 1]}, id=f"c{n}")],
                                 prompt_tokens=3000, model="gpt-4o")
                 if n <= len(SERVICES) else chat_completion("db-5 and db-8", prompt_tokens=3000, model="gpt-4o"))
        reply["usage"]["prompt_tokens_details"] = {"cached_tokens": 1000}
        return reply

    with FakeOpenAIServer(responder=responder) as server:
        model = OpenAICompatModel("gpt-4o", base_url=server.base_url, api_key="k", backoff_base=0.001)
        cheap = OpenAICompatModel("gpt-4o-mini", base_url=server.base_url, api_key="k", backoff_base=0.001)
        compaction = Compaction(window=5000, summary_model=cheap)
        result = Agent(model, tools=[search_logs, *compaction.tools()], instructions="You investigate outages.",
                       context=compaction, limits=Limits(max_steps=30)).run("Why does checkout fail?")
        summaries = [r.body for r in server.requests if r.body["messages"][0]["content"].startswith("You compact")]
    assert result.completed, result.error
    assert summaries and summaries[0]["model"] == "gpt-4o-mini"
    # the prefix the provider caches: byte-identical system prompt, task and tool list on every call
    prefixes = {json.dumps([b["messages"][:2], b["tools"]], sort_keys=True) for b in main_calls}
    assert len(prefixes) == 1
    last = main_calls[-1]["messages"]
    assert last[2]["role"] == "user" and last[2]["content"].startswith("[Context compacted")
    assert "pool exhausted on host db-7" in last[2]["content"]  # gateway's clue, kept verbatim
    assert len(last) < len(result.messages)
    # cached tokens counted and priced at the cache rate
    usage = result.usage
    assert usage.cached_input_tokens == 1000 * len(main_calls)
    pricing = Pricing()
    full = sum(pricing.cost(m, u, 7) for m, u in [("gpt-4o", 3000)] * len(main_calls)) + sum(
        pricing.cost("gpt-4o-mini", 400, 7) for _ in summaries)
    assert usage.cost_usd < full
