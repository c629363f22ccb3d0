"""Benchmark: how well the routing tables predict a token's device on held-out routing (issue 5).

Fit on 20% of the requests (seed 0), score on the other 80%: the token -> expert table Cp
(top-k recall), the token -> device table T (Sem-MoE §3.2), the device n-gram table A with
look-back n (Sem-MoE / s-MoE App. B.1) and their combination by Sem-MoE Alg. 3 (`Tp > Ap`),
with and without OOV mapping through the model's input embedding, for each placement and EP
degree. Accuracy = share of (token, layer) whose predicted device is its device state (the
device hosting most of its real experts); "local" = share of activations on the predicted
device (unconstrained by the equal-chunk rule), against the oracle's. `Ts` is T with the
"state" confidence (`TokenDevice(confidence="state")`). Reports; asserts nothing.

    python benchmarks/bench_predictors.py [--trace tiny-moe64] [--ep 4 8] [--methods semmoe] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from sempar.paths import assets_dir
from sempar.placement import solve
from sempar.predict import (DeviceNgram, EmbeddingOOV, ExpertConfidence, TokenDevice,
                            load_input_embedding, prediction_accuracy)
from sempar.trace import read_trace, split_by_request


def _trace_path(name: str) -> Path:
    p = Path(name)
    return p if p.suffix == ".parquet" else assets_dir() / "traces" / f"{name}.parquet"


def measure(trace_name: str, eps: list[int], methods: list[str], ns: list[int], seed: int,
            log) -> dict:
    trace = read_trace(_trace_path(trace_name))
    fit, ev = split_by_request(trace, 0.2, seed=seed)
    model_dir = assets_dir() / "models" / trace.meta.model
    emb = load_input_embedding(model_dir) if model_dir.is_dir() else None
    oov = EmbeddingOOV(emb) if emb is not None else None
    known = np.unique(fit.token_id)
    out = {"trace": trace_name, "fit_tokens": fit.num_tokens, "eval_tokens": ev.num_tokens,
           "fit_distinct_tokens": int(known.size),
           "unseen_token_fraction": float(np.mean(~np.isin(ev.token_id, known))),
           "unseen_id_fraction": float(np.mean(~np.isin(np.unique(ev.token_id), known))),
           "oov": emb is not None,
           "expert_recall": {"plain": ExpertConfidence().fit(fit).accuracy(ev).tolist()},
           "placements": {}}
    if oov is not None:
        out["expert_recall"]["oov"] = ExpertConfidence(oov=oov).fit(fit).accuracy(ev).tolist()
    for method in methods:
        for ep in eps:
            t0 = time.perf_counter()
            p = solve(method, fit, num_devices=ep, seed=seed)
            log(f"{method} EP {ep}: solved in {time.perf_counter() - t0:.1f}s")
            tables = {"T": TokenDevice().fit(fit, p), "Ts": TokenDevice(confidence="state").fit(fit, p)}
            if oov is not None:
                tables["T+oov"] = TokenDevice(oov=oov).fit(fit, p)
                tables["Ts+oov"] = TokenDevice(oov=oov, confidence="state").fit(fit, p)
            rows, nbytes, oracle = {}, {"T": tables["T"].nbytes()["device"]}, None
            for n in ns:
                ng = DeviceNgram(n=n).fit(fit, p)
                nbytes[f"A n={n}"] = ng.nbytes()["device"]
                for tname, td in tables.items():
                    r = prediction_accuracy(ev, p, td, ng)
                    oracle = r["local_mean"]["oracle"]
                    if n == ns[0]:
                        rows[tname] = _row(r, "token")
                    if tname == "T":
                        rows[f"A n={n}"] = _row(r, "ngram")
                    rows[f"{tname}|A n={n}"] = _row(r, "combined")
            out["placements"][f"{method}@{ep}"] = {"rows": rows, "oracle_local_mean": oracle,
                                                   "table_bytes": nbytes}
    return out


def _row(r: dict, name: str) -> dict:
    row = {"per_layer": np.round(r[name], 4).tolist(), "mean": round(r[f"{name}_mean"], 4),
           "local_mean": round(r["local_mean"][name], 4)}
    if name == "combined":
        row["token_chosen"] = round(float(np.mean(r["token_chosen"])), 4)
    return row


def print_tables(res: dict) -> None:
    print(f"{res['trace']}: fit {res['fit_tokens']} tokens ({res['fit_distinct_tokens']} distinct "
          f"ids), eval {res['eval_tokens']}; eval tokens unseen in fit: "
          f"{res['unseen_token_fraction']:.3f} of occurrences, {res['unseen_id_fraction']:.3f} of "
          f"distinct ids")
    for name, rec in res["expert_recall"].items():
        print(f"Cp top-k recall ({name}): " + " ".join(f"{x:.3f}" for x in rec)
              + f"  mean {np.mean(rec):.3f}")
    for key, pl in res["placements"].items():
        rows = pl["rows"]
        L = len(next(iter(rows.values()))["per_layer"])
        print(f"\n{key}: device-state accuracy per layer (oracle local share "
              f"{pl['oracle_local_mean']:.3f}); bytes: "
              + ", ".join(f"{k} {v}" for k, v in pl["table_bytes"].items()))
        print(f"{'predictor':<14}" + "".join(f"{'L' + str(l):>7}" for l in range(L))
              + f"{'mean':>7}{'local':>7}{'T used':>7}")
        for name, row in rows.items():
            used = f"{row['token_chosen']:7.3f}" if "token_chosen" in row else " " * 7
            print(f"{name:<14}" + "".join(f"{x:7.3f}" for x in row["per_layer"])
                  + f"{row['mean']:7.3f}{row['local_mean']:7.3f}{used}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="tiny-moe64", help="dev trace name or a .parquet path")
    ap.add_argument("--ep", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--methods", default="semmoe", help="comma-separated placement methods")
    ap.add_argument("--ngram", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args()
    res = measure(args.trace, args.ep, args.methods.split(","), args.ngram, args.seed,
                  log=lambda msg: print(msg, file=sys.stderr))
    if args.json:
        print(json.dumps(res))
    else:
        print_tables(res)


if __name__ == "__main__":
    main()
