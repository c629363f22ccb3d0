"""The engines' own balancers and replica slots under drift, side by side in one run (issues 43
and 45), on the drift streams of benchmarks/bench_drift.py (built from the shipped real traces).

    nice -n 5 python benchmarks/bench_drift_engines.py --json drift-engines.json
    python scripts/make_results.py drift-engines.json --out docs/results/

Suites (`--suites`):
- `engines` (issue 43): EP 8, R = 0 and R = 8, at each engine's default cadence
  (`sempar.drift.engines`: vLLM every 3 steps, SGLang every step, one step's window, a step =
  1000 forward passes), each served by that engine's own dispatch among copies (vLLM's hash,
  SGLang's `static`): `sempar-engine` (the plug-in's core, `sempar.eplb.policy`) against
  `vllm-eplb` and `sglang-eplb` (each engine's default policy through its installed code).
  Targets: against the engine whose cadence it runs at, mean exact-home LAR >= 1.20x, imbalance
  p95 <= theirs + 0.02, migrated bytes <= theirs. Beside them the ceiling
  (`sempar.drift.references`, `engine-hindsight`): with hindsight, per step the best of
  sempar's (and EPLB's) placements of the step's own requests, the same slots and dispatch,
  every step within theirs' imbalance p95 + 0.02 (the target's bound); its LAR over the
  engine's is the most the LAR ratio could reach within the engine's balance (`ceiling LAR
  ratio`: below 1.20, the 1.20x target is out of reach on that case). And the past-only
  reference (`engine-window`): the same solves and pick fed only the engine's window at its
  cadence (what the engine hands its balancer), no move budget (`window-fed LAR ratio`: below
  1.20, no balancer fed only its window reaches the target with sempar's solver).
- `replicas` (issue 45, item 3): EP 4 and 8, R = G, dispatch `--replica-dispatch` (default
  `lp-cap`, the per-batch LP over every copy; `locality-first` was the first measurement):
  `sempar-incremental` (with its switch test: updates inside a step as soon as the served
  requests show a new mix, `sempar.drift.events`), `resolve` and `eplb-periodic` with the same
  slots and dispatch, every step. Targets: incremental imbalance p95 <= 1.10 and LAR >= 0.95 x
  resolve's; against eplb-periodic higher LAR and imbalance p95 no higher. Beside them the
  ceiling: `oracle` (`references`' `eplb-hindsight`), EPLB solved on each step's own requests (the traffic no past-only policy has seen) with the same
  slots and dispatch; and per policy the p95 over the settled steps (`bench_drift.unseen_steps`:
  the steps whose main domain held under half of the window before them left out).

A policy that cannot run here (an engine not installed, the plug-in's core absent) is recorded
with its one-line reason and left out of the verdicts that need it. The JSON is a list of cases
(`make_results.py` renders `docs/results/drift-engines.md` from it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_drift import STREAMS  # noqa: E402

ENGINE_POLICIES = ["sempar-engine", "vllm-eplb", "sglang-eplb"]
REPLICA_POLICIES = ["sempar-incremental", "resolve", "eplb-periodic"]
ENGINE_DISPATCH = {"vllm": "vllm-hash", "sglang": "sglang-static"}   # each engine's default


@dataclass(frozen=True)
class EnginesRun:
    """The engines suite's options of a case: sempar-engine's PluginConfig knobs (field, value;
    `--plugin`), the references run beside the policies (`sempar.drift.references`,
    `--references`) and the window-fed reference's caps (None: the target's bound;
    `--window-caps`)."""

    plugin: tuple[tuple[str, str], ...] = ()
    references: tuple[str, ...] = ("engine-hindsight", "engine-window")
    window_caps: tuple[float | None, ...] = (None, 1.10)


@dataclass(frozen=True)
class ReplicasRun:
    """The replicas suite's knobs of `sempar-incremental` for a case, each None for its
    default: ReplicaPass.locality (`--replica-locality`), Events.replica_moves
    (`--event-replica-moves`), ReplicaPass.locality_free (`--locality-free`),
    ReplayConfig.locality_resamples (`--locality-resamples`)."""

    locality: float | None = None
    event_replica_moves: int | None = None
    locality_free: bool | None = None
    locality_resamples: int | None = None


def load_stream(name: str):
    from sempar.drift.streams import drift_stream
    from sempar.paths import assets_dir
    from sempar.trace import read_trace

    asset, order, k, every, window = STREAMS[name]
    trace = read_trace(assets_dir() / "traces" / f"{asset}.parquet", optional=("domain",))
    return trace, drift_stream(trace, order, switch_every=k, mix=0.8, seed=0), every, window


def settle(out: dict, stream_name: str, window: int) -> None:
    """Per policy (and the oracle): the step imbalances and their p95 over the settled steps."""
    from bench_drift import settled_p95, unseen_steps

    asset, order, k, _, _ = STREAMS[stream_name]
    pols = out["policies"]
    if not pols:
        return
    unseen = unseen_steps({"asset": asset, "order": order, "switch_every": k, "window": window,
                           "policies": pols})
    out["unseen_steps"] = unseen
    for p in pols.values():
        p["imbalance_steps"] = [s["imbalance"] for s in p["steps"]]
        p["imbalance_p95_settled"] = settled_p95(p, unseen)
    if "oracle" in out:
        o = out["oracle"]
        o["imbalance_p95_settled"] = settled_p95(
            {"steps": [{"imbalance": x} for x in o["imbalance_steps"]]}, unseen)


def run_case(stream_name: str, suite: str, ep: int, redundant: int, dispatch: str,
             engine: str, policies: list[str], max_steps: int | None, max_moves: int,
             knobs: ReplicasRun = ReplicasRun(), opts: "EnginesRun | None" = None) -> dict:
    from dataclasses import replace

    from sempar.drift.config import ReplayConfig
    from sempar.drift.policies import POLICIES
    from sempar.drift.references import REFERENCES
    from sempar.drift.replay import replay
    from sempar.solve_options import SolveOptions

    opts = opts or EnginesRun()
    plugin = opts.plugin
    trace, stream, every, window = load_stream(stream_name)
    why = {n: POLICIES.get(n).unavailable() for n in policies
           if POLICIES.get(n).unavailable is not None}
    why = {n: w for n, w in why.items() if w}
    run = [n for n in policies if n not in why]
    cfg = ReplayConfig.for_model(trace.meta.model, ep,
                                 solve=SolveOptions(jobs=1, redundant=redundant),
                                 rebalance=dict(max_moves=max_moves), every=every, window=window,
                                 max_steps=max_steps, dispatch=dispatch, engine=engine,
                                 plugin=plugin)
    if knobs.locality is not None:              # sempar-incremental's replica slots
        cfg = cfg.with_(replicas=replace(cfg.replicas, locality=knobs.locality))
    if knobs.locality_free is not None:
        cfg = cfg.with_(replicas=replace(cfg.replicas, locality_free=knobs.locality_free))
    if knobs.locality_resamples is not None:    # the guard of its locality retargets
        cfg = cfg.with_(locality_resamples=knobs.locality_resamples)
    if knobs.event_replica_moves is not None:   # its event / young-stream updates' slots
        cfg = cfg.with_(events=replace(cfg.events, replica_moves=knobs.event_replica_moves))
    t0 = time.perf_counter()
    out = replay(stream, run, cfg) if run else {"policies": {}}
    if suite == "replicas":
        out["oracle"] = REFERENCES.get("eplb-hindsight").run(stream, cfg)
    settle(out, stream_name, window)
    theirs = f"{engine}-eplb"
    if suite == "engines" and theirs in out["policies"]:
        t95 = out["policies"][theirs]["imbalance_p95"]
        for key, name in (("oracle", "engine-hindsight"), ("past_only", "engine-window")):
            if name in opts.references:
                kw = {"caps": opts.window_caps} if name == "engine-window" else {}
                out[key] = REFERENCES.get(name).run(stream, cfg, t95, **kw)
        settle(out, stream_name, window)         # the oracle's settled p95
    for p in out["policies"].values():
        imb = [st["imbalance"] for st in p["steps"]]
        p["imbalance_step_max"] = float(max(imb)) if imb else 0.0   # beside p95 (10 steps)
        del p["steps"]                # the page needs the summaries; keep the JSON small
    out["replica_locality"] = cfg.replicas.locality
    if plugin:                                  # sempar-engine's knobs, where not its defaults
        out["plugin"] = dict(plugin)
    out["replica_locality_free"] = cfg.replicas.locality_free
    out["young_resamples"] = cfg.young_resamples
    out["locality_resamples"] = cfg.locality_resamples
    out.update({"suite": suite, "stream": stream_name, "model": trace.meta.model, "ep": ep,
                "redundant": redundant, "dispatch": dispatch, "engine": engine,
                "unavailable": why, "wall_s": time.perf_counter() - t0})
    out["verdicts"] = (engine_verdicts if suite == "engines" else replica_verdicts)(out)
    return out


def borrow_resolve(r: dict, earlier: list[dict], note: str) -> None:
    """`resolve`'s summary from the earlier case of the same stream and EP (`--resolve-from`),
    the case labelled (`run_note`) and its verdicts recomputed; unchanged where none matches."""
    for e in earlier:
        if (e.get("suite"), e["stream"], e["ep"]) == ("replicas", r["stream"], r["ep"]) \
                and "resolve" in e["policies"]:
            r["policies"]["resolve"] = e["policies"]["resolve"]
            r["run_note"] = note
            r["verdicts"] = replica_verdicts(r)
            return


def engine_verdicts(r: dict) -> dict:
    """Issue 43's targets: sempar-engine against the engine whose cadence it runs at."""
    p = r["policies"]
    theirs = f"{r['engine']}-eplb"
    if "sempar-engine" not in p or theirs not in p:
        return {"skipped": f"needs sempar-engine and {theirs}"}
    s, t = p["sempar-engine"], p[theirs]
    ratio = s["lar_mean"] / max(t["lar_mean"], 1e-12)
    return {"against": theirs, "lar_ratio": ratio, "lar_ge_1.20x": ratio >= 1.20,
            "p95_delta": s["imbalance_p95"] - t["imbalance_p95"],
            "p95_within_0.02": s["imbalance_p95"] <= t["imbalance_p95"] + 0.02,
            "bytes_no_more": s["migrated_bytes"] <= t["migrated_bytes"],
            **_ceiling(r, t)}


def _ceiling(r: dict, t: dict) -> dict:
    """The engines case's references against theirs (`engine-hindsight`, the ceiling, and
    `engine-window`, past-only): their LAR ratios and p95, whether the 1.20x target is
    reachable there at all (not a target: no bool, so not a verdict)."""
    out = {}
    for key, name in (("oracle", "ceiling"), ("past_only", "window")):
        if key in r:
            o = r[key]
            out.update({f"{name}_lar_ratio": o["lar_mean"] / max(t["lar_mean"], 1e-12),
                        f"{name}_p95": o["imbalance_p95"], f"{name}_lar": o["lar_mean"]})
    within = [f["lar_mean"] for f in r.get("past_only", {}).get("frontier", [])
              if f["imbalance_p95"] <= t["imbalance_p95"] + 0.02]
    if "past_only" in r:       # the window-fed caps' best LAR ratio within the target's p95
        out["window_within_lar_ratio"] = (max(within) / max(t["lar_mean"], 1e-12)
                                          if within else None)
    return out


def replica_verdicts(r: dict) -> dict:
    """Issue 45's drift targets: sempar-incremental against resolve and eplb-periodic."""
    p = r["policies"]
    if not {"sempar-incremental", "resolve", "eplb-periodic"} <= set(p):
        return {"skipped": "needs sempar-incremental, resolve and eplb-periodic"}
    i, s, e = p["sempar-incremental"], p["resolve"], p["eplb-periodic"]
    ratio = i["lar_mean"] / max(s["lar_mean"], 1e-12)
    v = {"lar_vs_resolve": ratio, "lar_ge_0.95_resolve": ratio >= 0.95,
         "p95_le_1.10": i["imbalance_p95"] <= 1.10,
         "vs_eplb_lar_higher": i["lar_mean"] > e["lar_mean"],
         "vs_eplb_p95_no_higher": i["imbalance_p95"] <= e["imbalance_p95"]}
    if "imbalance_p95_settled" in i:             # measured since the oracle was added
        v["settled_p95"] = i["imbalance_p95_settled"]
        v["settled_p95_le_1.10"] = i["imbalance_p95_settled"] <= 1.10
    if "oracle" in r:
        v["oracle_p95"] = r["oracle"]["imbalance_p95"]
        v["oracle_lar"] = r["oracle"]["lar_mean"]
    return v


def cases(a) -> list[tuple]:
    out = []
    for name in a.streams.split(","):
        if "engines" in a.suites:
            for R in (int(x) for x in a.redundant.split(",")):
                for engine in a.engines.split(","):
                    out.append((name, "engines", 8, R, ENGINE_DISPATCH[engine], engine,
                                ENGINE_POLICIES))
        if "replicas" in a.suites:
            for ep in (int(x) for x in a.eps.split(",")):
                out.append((name, "replicas", ep, ep, a.replica_dispatch, "vllm",
                            [n for n in REPLICA_POLICIES
                             if not (a.resolve_from and n == "resolve")
                             and (not a.policies or n in a.policies.split(","))]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default=",".join(STREAMS))
    ap.add_argument("--suites", default="engines,replicas")
    ap.add_argument("--eps", default="4,8", help="replicas suite: EP degrees (R = G each)")
    ap.add_argument("--redundant", default="0,8", help="engines suite: replica slots R")
    ap.add_argument("--engines", default="vllm,sglang",
                    help="engines suite: the cadences (and dispatch) of these engines")
    ap.add_argument("--replica-dispatch", default="lp-cap",
                    help="replicas suite: the dispatch among copies every policy gets")
    ap.add_argument("--max-steps", type=int, default=None, help="steps per replay (None: all)")
    ap.add_argument("--max-moves", type=int, default=32)
    ap.add_argument("--json", type=Path, required=True, help="write the cases here (after each)")
    ap.add_argument("--append", action="store_true", help="add to the cases --json holds")
    ap.add_argument("--resolve-from", type=Path, default=None,
                    help="replicas suite: take `resolve` (the costly full re-solve per step) from "
                         "this earlier JSON's case of the same stream and EP instead of running "
                         "it; the case is labelled with --resolve-note")
    ap.add_argument("--policies", default="",
                    help="replicas suite: only these of its policies (comma-separated; a costly "
                         "one, e.g. resolve, in its own process, its JSON then --resolve-from)")
    ap.add_argument("--resolve-note", default="resolve from an earlier run")
    ap.add_argument("--replica-locality", type=float, default=None,
                    help="sempar-incremental's ReplicaPass.locality (None: ReplayConfig's "
                         "default)")
    ap.add_argument("--locality-free", type=int, choices=(0, 1), default=None,
                    help="sempar-incremental's ReplicaPass.locality_free (None: the default)")
    ap.add_argument("--locality-resamples", type=int, default=None,
                    help="sempar-incremental's ReplayConfig.locality_resamples (None: the "
                         "default)")
    ap.add_argument("--event-replica-moves", type=int, default=None,
                    help="sempar-incremental's Events.replica_moves (None: the default)")
    ap.add_argument("--plugin", action="append", default=[], metavar="FIELD=VALUE",
                    help="engines suite: a sempar-engine PluginConfig knob, read as the plug-in "
                         "reads SEMPAR_EPLB_<FIELD> (repeatable; none: its defaults)")
    ap.add_argument("--window-caps", default="bound,1.10",
                    help="engines suite: the window-fed reference's balance caps (bound: the "
                         "target's, theirs' imbalance p95 + 0.02; its figures the first's)")
    ap.add_argument("--references", default="engine-hindsight,engine-window",
                    help="engines suite: the references run beside the policies "
                         "(`sempar.drift.references`; '' none, for a quick look at a knob)")
    a = ap.parse_args()
    plugin = tuple(tuple(kv.split("=", 1)) for kv in a.plugin)
    from dataclasses import fields

    from sempar.drift.engines import plugin_config
    from sempar.eplb.config import PluginConfig
    from sempar.errors import InputError

    known = {f.name for f in fields(PluginConfig)} - {"engine", "seed"}
    bad = [kv for kv, p in zip(a.plugin, plugin) if len(p) != 2 or p[0] not in known]
    if bad:
        ap.error(f"--plugin {bad[0]}: not FIELD=VALUE of a PluginConfig field "
                 f"({', '.join(sorted(known))})")
    try:
        plugin_config(plugin)
    except InputError as e:
        ap.error(f"--plugin: {e}")
    earlier = json.loads(a.resolve_from.read_text()) if a.resolve_from else []
    results = json.loads(a.json.read_text()) if a.append and a.json.exists() else []
    for c in cases(a):
        r = run_case(*c, max_steps=a.max_steps, max_moves=a.max_moves,
                     knobs=ReplicasRun(a.replica_locality, a.event_replica_moves,
                                       None if a.locality_free is None else bool(a.locality_free),
                                       a.locality_resamples),
                     opts=EnginesRun(plugin, tuple(a.references.split(",")),
                                     tuple(None if x == "bound" else float(x)
                                           for x in a.window_caps.split(","))))
        if a.resolve_from and r["suite"] == "replicas":
            borrow_resolve(r, earlier, a.resolve_note)
        results.append(r)
        for n, p in r["policies"].items():
            print(f"{r['suite']:8s} {r['stream']:12s} EP {r['ep']} R {r['redundant']} "
                  f"{r['dispatch']:14s} {n:18s} LAR {p['lar_mean']:.4f}  imb p95 "
                  f"{p['imbalance_p95']:.3f}  migrated {p['migrated_bytes'] / 1e9:7.1f} GB "
                  f"({p['moves_per_step']:.1f} copies/step)  updates {p['updates']}", flush=True)
        for n, w in r["unavailable"].items():
            print(f"{r['suite']:8s} {r['stream']:12s} {n}: unavailable: {w}", flush=True)
        print(f"  verdicts {r['verdicts']}  ({r['wall_s']:.0f} s)", flush=True)
        a.json.write_text(json.dumps(results) + "\n")   # one line: make_results reads it


def _row(n: str, p: dict) -> str:
    events = f" + {p['events']} events" if p.get("events") else ""   # updates inside steps
    return (f"| {n} | {p['lar_mean']:.4f} | {p['imbalance_p95']:.3f} | "
            f"{p['imbalance_layer_p95']:.3f} | {p['migrated_bytes'] / 1e9:.1f} | "
            f"{p['migrated_bytes_per_step'] / 1e9:.2f} | {p['moves_per_step']:.1f} | "
            f"{p['updates']}{events} | {len(p.get('fallbacks', []))} | {p['solve_s_mean']:.2f} |")


def _run_note(r: dict) -> str:
    """" (NOTE)" where a case carries a `run_note` (a case kept from an earlier run) or
    sempar-engine's knobs other than its defaults (`--plugin`)."""
    notes = [r["run_note"]] if r.get("run_note") else []
    if r.get("plugin"):
        notes.append("sempar-engine " + ", ".join(f"{k}={v}" for k, v in r["plugin"].items()))
    return f" ({'; '.join(notes)})" if notes else ""


def _mean_max(p: dict) -> str:
    """Imbalance mean / worst step ("-" where a case did not keep it)."""
    return " / ".join("-" if p.get(k) is None else f"{p[k]:.3f}"
                      for k in ("imbalance_mean", "imbalance_step_max"))


def summary(results: list[dict]) -> list[str]:
    """One line per case: the target's figures and whether each is met."""
    out = ["## Summary", "",
           "| suite | stream | EP | R | dispatch | ours | against | LAR ratio | p95 ours / theirs |"
           " mean / max ours, theirs | settled p95 ours / theirs | ceiling p95 / LAR |"
           " ceiling LAR ratio | window-fed LAR ratio / p95 (best within p95 + 0.02) | bytes GB ours / theirs | met |",
           "| --- | --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: "
           "| ---: | ---: | --- |"]
    for r in results:
        v, p = r["verdicts"], r["policies"]
        if "skipped" in v:
            out.append(f"| {r['suite']} | {r['stream']} | {r['ep']} | {r['redundant']} | "
                       f"{r['dispatch']} | | | | | | | | | | | skipped: {v['skipped']} |")
            continue
        ours = "sempar-engine" if r["suite"] == "engines" else "sempar-incremental"
        them = v["against"] if r["suite"] == "engines" else "eplb-periodic"
        ratio = v["lar_ratio"] if r["suite"] == "engines" else v["lar_vs_resolve"]
        settled = (f"{p[ours]['imbalance_p95_settled']:.3f} / "
                   f"{p[them]['imbalance_p95_settled']:.3f}"
                   if "imbalance_p95_settled" in p[ours] else "not measured")
        ceil = (f"{r['oracle']['imbalance_p95']:.3f} / {r['oracle']['lar_mean']:.4f}"
                if "oracle" in r else "-")
        cratio = f"{v['ceiling_lar_ratio']:.3f}" if "ceiling_lar_ratio" in v else "-"
        wratio = "-"
        if "window_lar_ratio" in v:
            w = v.get("window_within_lar_ratio")
            wratio = (f"{v['window_lar_ratio']:.3f} / {v['window_p95']:.3f} ("
                      f"{'none' if w is None else f'{w:.3f}'})")
        ok = [k for k, x in v.items() if isinstance(x, bool) and x]
        no = [k for k, x in v.items() if isinstance(x, bool) and not x]
        out.append(f"| {r['suite']} | {r['stream']}{_run_note(r)} | {r['ep']} | "
                   f"{r['redundant']} | {r['dispatch']} | {ours} | {them} | {ratio:.3f}"
                   f"{'' if r['suite'] == 'engines' else ' (vs resolve)'} | "
                   f"{p[ours]['imbalance_p95']:.3f} / {p[them]['imbalance_p95']:.3f} | "
                   f"{_mean_max(p[ours])}, {_mean_max(p[them])} | {settled} | {ceil} | {cratio} | {wratio} | "
                   f"{p[ours]['migrated_bytes'] / 1e9:.1f} / {p[them]['migrated_bytes'] / 1e9:.1f} | "
                   f"met: {', '.join(ok) or '-'}; missed: {', '.join(no) or '-'} |")
    return out + [""]


def p95_sources(results: list[dict]) -> list[str]:
    """Where each replicas case's imbalance p95 comes from: steps, steps after a switch to
    unseen traffic, the two worst steps (np.percentile interpolates between them: with 8-10
    steps p95 = worst2 + 0.55-0.65 x (worst - worst2)), p95 over all and over settled steps."""
    rows = [r for r in results if r["suite"] == "replicas" and "unseen_steps" in r]
    if not rows:
        return []
    out = ["## Where the imbalance p95 comes from", "",
           "Per case and policy: the two worst steps (* after a switch to traffic the window did "
           "not hold), the p95 over every step and over the settled ones. With n steps "
           "np.percentile puts p95 at 0.95 (n - 1) of the sorted steps: between the two worst "
           "(0.55 of the way to the worst at 10 steps, 0.65 at 8), so one or two steps decide "
           "it.", "",
           "| stream | EP | steps (after a switch) | policy | worst two steps | p95 all | "
           "p95 settled |", "| --- | ---: | --- | --- | --- | ---: | ---: |"]
    for r in rows:
        u = r["unseen_steps"]
        pols = {n: p["imbalance_steps"] for n, p in r["policies"].items()}
        if "oracle" in r:
            pols["oracle"] = r["oracle"]["imbalance_steps"]
        for n, xs in pols.items():
            top = sorted(range(len(xs)), key=lambda i: -xs[i])[:2]
            worst = ", ".join(f"{i}{'*' if u[i] else ''} {xs[i]:.3f}" for i in top)
            settled = [x for x, f in zip(xs, u) if not f]
            out.append(f"| {r['stream']}{_run_note(r)} | {r['ep']} | {len(u)} ({sum(u)}: "
                       f"{', '.join(str(i) for i, f in enumerate(u) if f)}) | {n} | {worst} | "
                       f"{float(np.percentile(xs, 95)):.3f} | "
                       f"{float(np.percentile(settled, 95)) if settled else float('nan'):.3f} |")
    return out + [""]


def tables(results: list[dict]) -> str:
    """The page body (`scripts/make_results.py`): one table per case, its verdicts below."""
    lines = ["Each case: the policies side by side on one drift stream (`sempar replay`); LAR = "
             "mean over steps of the exact-home LAR after dispatch (an activation is local when "
             "the copy the dispatch rule chose is on the token's home device); imbalance p95 = "
             "95th percentile over steps of the mean-over-layers max/mean device load after "
             "dispatch (a stream has 8-10 steps, so p95 is near the worst step: the summary gives "
             "the mean over steps and the worst step beside it, where a case kept it); layer p95 "
             "over every step and layer; migrated = expert copies x the "
             "model's expert bytes (total, and mean per step); copies/step = expert copies per "
             "step; updates = rebalances run before a step (+ events: updates inside a step "
             "where sempar-incremental's switch test fired, `drift.events`); fallbacks = "
             "rebalances where the plug-in returned "
             "the engine's own result; update s = mean wall seconds of one update (a loaded "
             "machine: not a figure of the method). Ceiling (`oracle`): in the replicas suite "
             "EPLB solved on each step's own requests; in the engines suite (`engine-hindsight`) "
             "the best LAR of sempar's (and EPLB's) placements of each step's own requests, with "
             "hindsight, the same slots and dispatch, every step within the engine's imbalance "
             "p95 + 0.02; ceiling LAR ratio = its LAR / the engine's: the most the LAR ratio "
             "could reach within the target's balance with hindsight (below 1.20 the target is "
             "out of reach there; a heuristic, not an upper bound). Window-fed (past-only, "
             "`engine-window`): the same solves and pick fed only the engine's window at its "
             "cadence, no move budget; window-fed LAR ratio = its LAR / the engine's (below "
             "1.20 no balancer fed only its window reaches the target with sempar's solver; "
             "its updates column counts its solves, step 0's included), at the target's bound "
             "(theirs' p95 + 0.02) and at tighter caps (rows `window-fed at cap`); best within "
             "p95 + 0.02 = the best LAR ratio among those caps whose p95 is within theirs + 0.02 "
             "(none: no cap).", ""] + summary(results) + p95_sources(results)
    for r in results:
        lines += [f"## {r['suite']}: {r['stream']}{_run_note(r)} ({r['model']}), EP {r['ep']}, "
                  f"R {r['redundant']}, "
                  f"dispatch {r['dispatch']}"
                  + (f", {r['engine']} cadence" if r["suite"] == "engines" else ""), "",
                  f"{r.get('requests', '?')} requests, {r.get('steps', '?')} steps of "
                  f"{r.get('every', '?')} requests, window {r.get('window', '?')}.", "",
                  "| policy | LAR | imbalance p95 | layer p95 | migrated GB | GB/step | "
                  "copies/step | updates | fallbacks | update s |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [_row(n, p) for n, p in r["policies"].items()]
        if "oracle" in r:
            o = r["oracle"]
            what = o.get("what", "EPLB on the step's own requests")
            lines.append(f"| oracle (ceiling: {what}) | "
                         f"{o['lar_mean']:.4f} | {o['imbalance_p95']:.3f} | | | | | | | |")
        if "past_only" in r:
            o = r["past_only"]
            lines.append(f"| window-fed (past-only: {o['what']}) | {o['lar_mean']:.4f} | "
                         f"{o['imbalance_p95']:.3f} | | {o['migrated_bytes'] / 1e9:.1f} | | | "
                         f"{len(o['picked'])} | | |")
            lines += [f"| window-fed at cap {f['cap']:.3f} | {f['lar_mean']:.4f} | "
                      f"{f['imbalance_p95']:.3f} | | {f['migrated_bytes'] / 1e9:.1f} | | | | | |"
                      for f in o.get("frontier", [])[1:]]
        if "unseen_steps" in r:
            steps = {n: p["imbalance_steps"] for n, p in r["policies"].items()}
            if "oracle" in r:
                steps["oracle"] = r["oracle"]["imbalance_steps"]
            if "past_only" in r:
                steps["window-fed"] = r["past_only"]["imbalance_steps"]
            lines += ["", "Imbalance per step (* after a switch to traffic the window did not "
                      "hold: `unseen`):", "",
                      "| policy | " + " | ".join(f"{i}{'*' if u else ''}" for i, u in
                                                 enumerate(r["unseen_steps"])) + " |",
                      "| --- |" + " ---: |" * len(r["unseen_steps"])]
            lines += [f"| {n} | " + " | ".join(f"{x:.3f}" for x in xs) + " |"
                      for n, xs in steps.items()]
        for n, w in r.get("unavailable", {}).items():
            lines.append(f"| {n} | unavailable: {w} | | | | | | | | |")
        v = r["verdicts"]
        lines += ["", "Verdicts: " + ", ".join(
            f"{k} {v[k]:.3f}" if isinstance(v[k], float) else f"{k} {v[k]}" for k in v), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
