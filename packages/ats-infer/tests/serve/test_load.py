"""Loopback load: 64 requests of different prompts and lengths from 8 concurrent clients, each
answered with exactly the text the same request gets when served alone (temperature 0): no request
lost, mixed up or changed by its batch-mates."""

from concurrent.futures import ThreadPoolExecutor

N_REQUESTS, CLIENTS = 64, 8


def requests(model: str) -> list[dict]:
    """Prompts of 1 to ~60 tokens, budgets of 4 to 40 tokens, half of them chat."""
    out = []
    for i in range(N_REQUESTS):
        text = f"def f{i}(x):\n" + "    y = x * 2\n" * (i % 5)
        budget = 4 + (i * 7) % 37
        if i % 2:
            out.append({"kind": "chat", "model": model, "max_tokens": budget, "temperature": 0,
                        "messages": [{"role": "user", "content": text}]})  # fmt: skip
        else:
            out.append({"kind": "text", "model": model, "max_tokens": budget, "temperature": 0,
                        "prompt": text})  # fmt: skip
    return out


def serve_one(client, request: dict) -> tuple[str, str, int]:
    fields = {k: v for k, v in request.items() if k != "kind"}
    if request["kind"] == "chat":
        r = client.chat.completions.create(**fields)
        text = r.choices[0].message.content
    else:
        r = client.completions.create(**fields)
        text = r.choices[0].text
    return text, r.choices[0].finish_reason, r.usage.completion_tokens


def test_concurrent_answers_equal_alone(client, server) -> None:
    batch = requests(server.model)
    alone = [serve_one(client, r) for r in batch]
    with ThreadPoolExecutor(CLIENTS) as pool:
        together = list(pool.map(lambda r: serve_one(client, r), batch))
    assert together == alone
    assert sum(tokens for _, _, tokens in alone) > 10 * N_REQUESTS  # real work was done
