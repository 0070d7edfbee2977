#!/usr/bin/env python3
"""Would a spanning layer that takes only `span` adjacent slots of an S-slot trunk ring (instead of
the whole ring, as pipeline/graph/slot_pool.hpp does) let its read overlap the compute before it?

A model of the ring's slot order, not of time: slots are freed in compute order, every freed slot is
claimed at once by the next queued read (the engine always has reads queued ahead), a one-slot
layer takes the slot it is given, and the spanning layer gathers slots until it holds `span`
adjacent ones (no wrap: the ring is one arena), then hands the rest back. The question per token is
whether, when the spanning layer's run is complete, another layer still holds a slot (its compute
has not ended: the read overlaps it) or none does (the ring drained first: today's behaviour).

    perf/ring_phase_sim.py                  # the table: S, span, streamed layers -> overlaps?
    perf/ring_phase_sim.py 3 2 25           # one case, token by token

Finding (docs/performance.md, "Analysed and not built"): with S >= 2 * span it always overlaps; with
S = 3, span = 2 only when the streamed layer count is 2 mod 3 -- the exp3 peer streams 25, so its
layer 0 would drain the ring every token exactly as now. Stdlib only.
"""
import sys
from collections import deque


def simulate(S, span, streamed, tokens=16, first_extra=0):
    """Per token: how many other layers held a slot when the spanning layer (the first streamed
    layer) got its run. `first_extra` one-slot reads before the first token shift the start."""
    free = deque(range(S))
    jobs = deque(["one"] * first_extra)
    for _ in range(tokens):
        jobs.extend(["span"] + ["one"] * (streamed - 1))
    holding = deque()  # slot lists of layers read and not yet computed, in compute order
    gathered, head, held_by_others = [], None, []
    while jobs or holding or head:
        if head is None and jobs:
            head = jobs.popleft()
        if head == "one" and free:
            holding.append([free.popleft()])
            head = None
            continue
        if head == "span" and free:
            gathered.append(free.popleft())
            s = set(gathered)
            run = next((a for a in sorted(s) if a + span <= S and all(a + i in s for i in range(span))), None)
            if run is not None:
                held_by_others.append(len(holding))
                for x in gathered:
                    if not run <= x < run + span:
                        free.appendleft(x)  # back to the next claim
                holding.append(list(range(run, run + span)))
                gathered, head = [], None
            continue
        if not holding:
            raise RuntimeError(f"stuck: S={S} span={span} gathered={gathered}")
        free.extend(holding.popleft())  # the oldest layer's compute ends
    return held_by_others


def overlaps_every_token(S, span, streamed):
    # steady state (after a few tokens), whatever one-slot reads came before the first token
    return all(min(simulate(S, span, streamed, 16, e)[4:]) > 0 for e in range(S))


if __name__ == "__main__":
    if len(sys.argv) == 4:
        S, span, n = map(int, sys.argv[1:])
        print(f"ring {S} slots, spanning layer takes {span}, {n} streamed layers: other layers holding a "
              f"slot when its run completed, per token: {simulate(S, span, n)}")
        sys.exit(0)
    print("S span  streamed-layer counts 1..40 where the spanning read overlaps every token")
    for S in range(2, 7):
        for span in range(2, S):
            good = [n for n in range(1, 41) if overlaps_every_token(S, span, n)]
            print(f"{S} {span:4}  {'all' if len(good) == 40 else good}")
