"""`run_bench`: one benchmark end to end (inputs, plan, the testbed or loopback run, the
simulator's prediction, the summary, the saved last result) and `execute`, the run itself."""

from __future__ import annotations

import pickle


from sempar.atomic import scratch_folder
from sempar.bench.inputs import load_dev, model_config, prefill_batches
from sempar.bench.plan import BASELINE, METHODS, plan_specs, predicted
from sempar.bench.result import result_path, run_figures, summarise
from sempar.console import json_text
from sempar.errors import InputError

MODEL = "tiny-moe64"
ENTRY = "sempar.runtime.run:testbed_rank"


def execute(specs: list, G: int, preset: str | None, scale: float, timeout_s: float,
            op_timeout_s: float = 60.0) -> list:
    """Run the specs on G testbed hosts (preset) or loopback ranks; RunResults in order."""
    from sempar.runtime.run import RunResult
    from sempar.testbed import netns, shaping
    from sempar.testbed.launch import launch

    with scratch_folder("sempar-bench-") as work:
        (work / "specs.pkl").write_bytes(pickle.dumps(specs))
        args = {"specs_path": str(work / "specs.pkl"), "out_path": str(work / "out.pkl")}
        kw = dict(timeout_s=timeout_s, op_timeout_s=op_timeout_s, grace_s=10.0)
        if preset:
            topo = shaping.resolve_preset(preset, G)
            with netns.testbed(G, topo, scale, preset=preset, ttl_s=timeout_s + 120) as tb:
                launch(ENTRY, G, args, tb=tb, **kw)
        else:
            launch(ENTRY, G, args, **kw)
        raw = pickle.loads((work / "out.pkl").read_bytes())
    return [RunResult.from_rank0(r, G, s.mode) for r, s in zip(raw, specs)]


def run_bench(G: int = 4, preset: str | None = "pcie-upi8", scale: float = 1 / 8000,
              batches: int = 2, batch_size: int = 8, seq: int = 128, repeats: int = 3,
              methods: list[str] | None = None, model: str = MODEL, timeout_s: float = 600.0,
              save: bool = True, progress=None) -> dict:
    """Benchmark `methods` (default all) at G; the `bench --json` object. `preset` None or
    "none": loopback; a preset without root / netns falls back to loopback (result["note"])."""
    from sempar.testbed import netns, shaping

    methods = list(methods or METHODS)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise InputError(f"--methods: {', '.join(bad)} not among {', '.join(METHODS)}")
    if BASELINE not in methods:
        methods.insert(0, BASELINE)
    if min(batches, batch_size, seq, repeats) < 1:
        raise InputError("--batches, --batch-size, --seq and --repeats must be positive")
    if not 2 <= G <= 64:
        raise InputError(f"--ep must be 2..64, got {G}")
    note = None
    if preset in (None, "", "none"):
        preset = None
    else:
        shaping.shaped_rates(shaping.resolve_preset(preset, G), scale)   # checks preset and scale
        ok, why = netns.netns_available()
        if not ok:
            note, preset = f"testbed unavailable ({why}): ran over loopback", None
    say = progress or (lambda s: None)
    _, held = load_dev(model)
    ids = prefill_batches(held, batches, batch_size, seq)
    specs, ctx, _, skipped = plan_specs(G, ids, methods, model, repeats, progress=progress)
    say(f"running {len(specs)} forwards x {repeats} on "
        f"{'testbed ' + preset if preset else 'loopback'}, G={G}")
    results = execute(specs, G, preset, scale, timeout_s)
    hidden = int(model_config(model)["hidden_size"])
    per: dict[str, list[dict]] = {}
    for spec, c, r in zip(specs, ctx, results):
        L = c["experts"].shape[1]
        pred = predicted(spec, c["experts"], hidden)
        per.setdefault(c["method"], []).append(run_figures(r, c["logits"], L, pred))
    base = summarise(per[BASELINE], METHODS.get(BASELINE))
    out = {m: base if m == BASELINE else summarise(rows, METHODS.get(m), base)
           for m, rows in per.items()}
    result = {"hosts": G, "preset": preset, "scale": scale if preset else None, "model": model,
              "transport": "testbed" if preset else "loopback",
              "batches": batches, "batch_size": batch_size, "seq": seq, "repeats": repeats,
              "baseline": BASELINE, "methods": out, "skipped": skipped}
    if note:
        result["note"] = note
    if save:
        from sempar.atomic import write_text_atomic

        write_text_atomic(result_path(), json_text(result, indent=1) + "\n",
                          option="$SEMPAR_BENCH_RESULT")
    return result
