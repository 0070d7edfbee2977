#!/usr/bin/env python3
"""Time to first token of a second chat turn, with and without serve's prompt cache (loopback,
standard library only).

Two servers of the same model: one with --prompt-cache-gb, one without. Each repetition writes a
fresh system prompt (its first words name the repetition, so no earlier snapshot matches it), sends
turn 1 (system + a question) to the cached server, then turn 2 (system + question + turn 1's reply +
a follow-up) to both servers, alternating which goes first, and times each turn 2 from the request
sent to the first streamed chunk carrying a token id. Prints per repetition the prompt tokens, the
cached tokens the cached server reported (usage.prompt_tokens_details.cached_tokens) and both
TTFTs, then the min and median of each side.

  perf/prompt_cache_ttft.py --cached-port 8081 --plain-port 8082 --reps 5 --filler-words 120
"""
import argparse
import json
import socket
import statistics
import time


def chat(port, messages, max_tokens, timeout):
    """One streamed chat request: (ttft_s, reply text, usage dict)."""
    body = {"messages": messages, "max_tokens": max_tokens, "stream": True, "thinking": False,
            "return_token_ids": True, "stream_options": {"include_usage": True}}
    payload = json.dumps(body).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.monotonic()
    sock.sendall(req)
    buf, ttft, text, usage, head_done = b"", None, "", {}, False
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        now = time.monotonic()
        buf += chunk
        if not head_done:
            if b"\r\n\r\n" not in buf:
                continue
            head, buf = buf.split(b"\r\n\r\n", 1)
            head_done = True
            if int(head.split(b" ", 2)[1]) != 200:
                raise RuntimeError(f"HTTP error: {head[:100]!r} {buf[:300]!r}")
        while True:
            at = buf.find(b"data: ")
            end = buf.find(b"\n\n", at) if at >= 0 else -1
            if end < 0:
                break
            data, buf = buf[at + 6:end], buf[end + 2:]
            if data == b"[DONE]":
                sock.close()
                return ttft, text, usage
            msg = json.loads(data)
            if msg.get("usage"):
                usage = msg["usage"]
            for choice in msg.get("choices", []):
                delta = choice.get("delta", {})
                if ttft is None and choice.get("token_ids"):
                    ttft = now - t0
                text += delta.get("content") or ""
    sock.close()
    raise RuntimeError("the stream ended without [DONE]")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cached-port", type=int, required=True)
    ap.add_argument("--plain-port", type=int, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--filler-words", type=int, default=120, help="the system prompt's length, in words")
    ap.add_argument("--max-tokens", type=int, default=8, help="turn 1's reply; turn 2 generates 1")
    ap.add_argument("--timeout", type=float, default=900.0)
    a = ap.parse_args()

    words = ("the engine streams every layer from disk and keeps the experts it needs in a cache "
             "sized by the plan").split()
    with_cache, without = [], []
    for r in range(a.reps):
        system = f"Session {r}: " + " ".join(words[i % len(words)] for i in range(a.filler_words))
        turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "What does it read?"}]
        _, reply, _ = chat(a.cached_port, turn1, a.max_tokens, a.timeout)
        turn2 = turn1 + [{"role": "assistant", "content": reply},
                         {"role": "user", "content": "And what does it keep?"}]
        order = [("cached", a.cached_port), ("plain", a.plain_port)]
        if r % 2:
            order.reverse()
        got = {}
        for name, port in order:
            got[name] = chat(port, turn2, 1, a.timeout)
        t_c, _, u_c = got["cached"]
        t_p, _, _ = got["plain"]
        with_cache.append(t_c)
        without.append(t_p)
        cached = (u_c.get("prompt_tokens_details") or {}).get("cached_tokens")
        print(f"rep {r}: turn 2 prompt {u_c.get('prompt_tokens')} tokens, {cached} cached; "
              f"TTFT with cache {t_c * 1e3:.0f} ms, without {t_p * 1e3:.0f} ms", flush=True)
    for name, xs in (("with cache", with_cache), ("without", without)):
        print(f"{name}: min {min(xs) * 1e3:.0f} ms, median {statistics.median(xs) * 1e3:.0f} ms "
              f"over {len(xs)}")


if __name__ == "__main__":
    main()
