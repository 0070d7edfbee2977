#!/usr/bin/env python3
"""Load generator for `k3flow serve` (loopback only, standard library only).

CLIENTS threads each send REQUESTS streamed completions (stream: true, return_token_ids: true) one
after another and time every chunk: time to first token (request sent -> first chunk carrying an
id) and per-token latency (the gap between successive ids of one request). Another thread samples
the server's RSS (/proc/PID/status VmRSS) every 0.25 s. Prints one summary (and --json FILE):
requests/s, tokens/s, p50/p99 of both latencies, errors, RSS over time. Bounded: CLIENTS x REQUESTS
requests of at most MAX_TOKENS tokens, each with a timeout; it stops by itself.

  perf/serve_load.py --port 8080 --pid $(pgrep -n k3flow) --clients 4 --requests 8 --max-tokens 32
"""
import argparse
import json
import socket
import threading
import time


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def one_request(port, body, timeout):
    """Returns (ttft_s, [gap_s...], n_tokens) or raises. A raw socket, not http.client: each event is
    timed when its bytes arrive (a buffered reader would hand over several at once)."""
    payload = json.dumps(body).encode()
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.monotonic()
    sock.sendall(req)
    buf = b""
    ttft, last, gaps, n, done, status = None, None, [], 0, False, None
    while not done:
        chunk = sock.recv(65536)
        if not chunk:
            break
        now = time.monotonic()
        buf += chunk
        if status is None:
            if b"\r\n\r\n" not in buf:
                continue
            head, buf = buf.split(b"\r\n\r\n", 1)
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                sock.settimeout(5)
                rest = buf
                while True:
                    more = sock.recv(65536)
                    if not more:
                        break
                    rest += more
                raise RuntimeError(f"HTTP {status}: {rest[:200]!r}")
        # Events are "data: ...\n\n" (JSON holds no raw newline); chunk-size lines sit between them.
        while True:
            at = buf.find(b"data: ")
            end = buf.find(b"\n\n", at) if at >= 0 else -1
            if end < 0:
                break
            data, buf = buf[at + 6:end], buf[end + 2:]
            if data == b"[DONE]":
                done = True
                break
            msg = json.loads(data)
            if "error" in msg:
                raise RuntimeError(msg["error"]["message"])
            for choice in msg.get("choices", []):
                for _ in choice.get("token_ids") or []:
                    if ttft is None:
                        ttft = now - t0
                    elif last is not None:
                        gaps.append(now - last)
                    last = now
                    n += 1
    sock.close()
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    return ttft, gaps, n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, default=0, help="the server's pid, for its RSS")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=8, help="per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt", default="Write a haiku about disks.")
    ap.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    ap.add_argument("--json", help="also write the summary here")
    a = ap.parse_args()

    ttfts, gaps, errors, tokens = [], [], [], [0]
    lock = threading.Lock()
    rss = []
    stop = threading.Event()

    def sampler():
        t0 = time.monotonic()
        while not stop.is_set():
            if a.pid:
                rss.append((round(time.monotonic() - t0, 2), rss_bytes(a.pid)))
            stop.wait(0.25)

    def client(c):
        for r in range(a.requests):
            body = {"prompt": f"{a.prompt} ({c}.{r})", "max_tokens": a.max_tokens, "stream": True,
                    "return_token_ids": True, "ignore_eos": True}
            try:
                t, g, n = one_request(a.port, body, a.timeout)
                with lock:
                    ttfts.append(t)
                    gaps.extend(g)
                    tokens[0] += n
            except Exception as e:  # noqa: BLE001 -- every failure is counted and reported
                with lock:
                    errors.append(str(e))

    st = threading.Thread(target=sampler)
    st.start()
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    stop.set()
    st.join()

    n_req = a.clients * a.requests
    summary = {
        "clients": a.clients, "requests": n_req, "max_tokens": a.max_tokens, "wall_s": round(wall, 3),
        "requests_per_s": round((n_req - len(errors)) / wall, 3), "tokens": tokens[0],
        "tokens_per_s": round(tokens[0] / wall, 2),
        "ttft_p50_ms": round(percentile(ttfts, 50) * 1e3, 2), "ttft_p99_ms": round(percentile(ttfts, 99) * 1e3, 2),
        "token_p50_ms": round(percentile(gaps, 50) * 1e3, 2), "token_p99_ms": round(percentile(gaps, 99) * 1e3, 2),
        "errors": len(errors), "first_errors": errors[:3],
        "rss_min_mib": round(min((b for _, b in rss), default=0) / 2**20, 1),
        "rss_max_mib": round(max((b for _, b in rss), default=0) / 2**20, 1),
        "rss_samples": rss[:: max(1, len(rss) // 20)],
    }
    print(f"{n_req} requests ({a.clients} clients x {a.requests}, {a.max_tokens} tokens) in {wall:.2f} s: "
          f"{summary['requests_per_s']} req/s, {summary['tokens_per_s']} tokens/s; "
          f"TTFT p50 {summary['ttft_p50_ms']} ms p99 {summary['ttft_p99_ms']} ms; "
          f"per token p50 {summary['token_p50_ms']} ms p99 {summary['token_p99_ms']} ms; "
          f"errors {len(errors)}; server RSS {summary['rss_min_mib']}..{summary['rss_max_mib']} MiB")
    for e in errors[:3]:
        print("  error:", e)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
