"""The switch test of `sempar-incremental` (`sempar.drift.events`) on the benchmark's drift
streams (`bench_drift.STREAMS`, built from the shipped real traces): where it fires and how far
its score separates real switches from the traffic's own variety inside a task or group.

Per stream and test (`Events.blocks()`: contiguous-block null, threshold 1.9; `Events()`, the
default: random-subset null, threshold 1.5):

- `quiet max`: the largest score (over the scales) where the tested block and its reference
  window hold one task / group (MMLU: one group, many subjects; mixture: one segment of
  `switch_every` requests), i.e. what a false alarm would have to reach;
- `switch max`: per real switch, the largest score of a block starting at or after it within
  a window (what must fire);
- `fires`: the requests where the test fires as the replay runs it (`drift.replay`: the state
  reset at each step's update; regrowth updates not counted), each marked with the real switch
  it follows within a window, or `false` where none.

No placement is solved: the test reads the requests' expert histograms only (seconds).
Usage: python benchmarks/drift_switch_test.py [--streams S]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_drift import STREAMS  # noqa: E402
from bench_drift_engines import load_stream  # noqa: E402


def switches(name: str, dom: np.ndarray, k: int) -> list[int]:
    """The stream's real switches: where the domain / group changes (tasks, groups), or where
    a mixture segment's main domain changes (every k requests)."""
    if STREAMS[name][1] == "mixture":
        return list(range(k, dom.size, k))
    return [int(r) for r in np.flatnonzero(dom[1:] != dom[:-1]) + 1]


def fires(hist: np.ndarray, R: int, every: int, window: int, ev) -> list[tuple[int, int]]:
    """[(regime start, request)] where `ev` declares a switch, as the replay tests it."""
    from sempar.drift.events import detect

    rng = np.random.default_rng(ev.seed)
    out, last = [], window
    for a in range(window, R, every):
        last = a                                      # the step's update
        for r in range(a, min(a + every, R)):
            c = detect(hist, r, r + 1 - last, window, ev, rng)
            if c:
                out.append((r - c + 1, r))
                last = r + 1
    return out


def main() -> None:
    from sempar.drift.events import Events, request_histograms, switch_score
    from sempar.drift.streams import request_table

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default=",".join(STREAMS))
    ap.add_argument("--thresholds", default="",
                    help="also the block null at these thresholds (comma-separated)")
    a = ap.parse_args()
    tests = {"blocks 1.9": Events.blocks(), "subsets 1.5 (default)": Events()}
    for t in filter(None, a.thresholds.split(",")):
        tests[f"blocks {float(t):.2f}"] = Events.blocks(threshold=float(t))
    for name in a.streams.split(","):
        _, stream, every, window = load_stream(name)
        k = STREAMS[name][2]
        hist = request_histograms(stream)
        _, dom, _, _ = request_table(stream)
        R = hist.shape[0]
        sw = switches(name, dom, k)
        print(f"{name}: {R} requests, step {every}, window {window}, real switches {sw}")
        for label, ev in tests.items():
            rng = np.random.default_rng(ev.seed)
            quiet, at = 0.0, {s: 0.0 for s in sw}
            for r in range(window, R):
                for c in ev.scales:
                    v = switch_score(hist, r, c, window, rng, ev.draws, ev.null)
                    lo = r - c + 1 - window
                    inside = [s for s in sw if lo < s <= r]
                    if not inside:
                        quiet = max(quiet, v)          # 0.0: no such block (mixture)
                    for s in sw:
                        if s <= r - c + 1 < s + window:
                            at[s] = max(at[s], v)
            f = fires(hist, R, every, window, ev)
            tag = [(st, r, next((f"after {s}" for s in sw[::-1] if s <= r < s + window),
                                "false")) for st, r in f]
            false = sum(t[2] == "false" for t in tag)
            hit = sorted({t[2] for t in tag if t[2] != "false"})
            print(f"  {label:22s} quiet max {quiet:.2f}; switch max "
                  + ", ".join(f"{s}: {v:.2f}" for s, v in at.items()))
            print(f"  {'':22s} fires {len(f)} ({false} false; switches found {len(hit)} of "
                  f"{len(sw)}): {tag}")


if __name__ == "__main__":
    main()
