"""How to deploy a planned deployment: the `sempar` commands that reproduce its placement, and
the SGLang launch line with only the flags the plan changes from the engine's defaults, each
with its reason.

The defaults are SGLang 0.5.23's (`sglang/srt/arg_groups/fields/*.py`, checked against the
installed package in tests/test_serving_plan.py): `--tp-size 1`, `--ep-size 1`,
`--attn-dp-size 1`, `--moe-a2a-backend none`, `--init-expert-location trivial` (experts in id
order, contiguous per rank: our `vanilla` placement), `--ep-num-redundant-experts 0`; chunked
prefill and running requests are sized by the engine from GPU memory, so the plan, which
compares deployments under one simulated budget, does not set them.

`sempar place` is given what the forecast solved on: the plan's trace file with
`--fit-fraction` of its requests (the seeded split `serve-sim` and `plan` fit on) and the
seed, so it writes the placement the plan scored. `export --to sglang` is printed only when
the exporter accepts the placement (export.engines.check_exportable, its own check).
"""

from __future__ import annotations

import shlex

from sempar.comm.pipelines import PIPELINES
from sempar.errors import InputError
from sempar.export.engines import check_exportable
from sempar.model_presets import MODEL_PRESETS
from sempar.router.policies import router_command
from sempar.serving.systems import Variant

FIT_FRACTION = 0.2          # forecast.Forecaster's split: placements fit on 20% of the requests
UPSTREAM_PIPELINES = ("sglang-ep", "attn-dp")     # modes an upstream SGLang launch runs

# --model-path per model: the checkpoints' Hugging Face repositories (SGLang downloads them)
MODEL_PATHS = {name: p.model_path for name, p in MODEL_PRESETS.items()}


def model_path(model: str) -> str:
    """What `--model-path` names for `model`: its Hugging Face repository, a packaged tiny
    model's folder, else the placeholder MODEL."""
    base = model.split(":")[-1]
    if base in MODEL_PATHS:
        return MODEL_PATHS[base]
    from sempar.paths import assets_dir

    folder = assets_dir() / "models" / base
    return str(folder) if folder.is_dir() else "MODEL"


def complexity(v: Variant, G: int) -> int:
    """How far a deployment is from SGLang's own EP launch: one each for a placement file
    (not vanilla), replica slots, a request router (policy not round-robin, Attention DP) and
    a pipeline upstream SGLang does not run. Ties within the forecast's noise go to the lower."""
    pipe = PIPELINES.get(v.pipeline)
    return (int(v.placement != "vanilla") + int(v.redundant_slots(G) > 0)
            + int(pipe.attention == "dp" and v.policy != "round-robin")
            + int(v.pipeline not in UPSTREAM_PIPELINES))


def engine_flags(v: Variant, G: int, placement_file: str | None) -> list[tuple[str, str]]:
    """(flag, reason) for each SGLang launch flag the deployment changes from its default."""
    pipe = PIPELINES.get(v.pipeline)
    r = v.redundant_slots(G)
    out = [(f"--tp-size {G}", f"the deployment spans {G} GPUs (default 1)"),
           (f"--ep-size {G}", f"experts split over the {G} GPUs (default 1: every GPU holds all)")]
    if pipe.attention == "dp":
        out.append((f"--attn-dp-size {G}", "attention data-parallel, one request batch per GPU "
                                           "(default 1: attention tensor-parallel)"))
    if v.pipeline == "sglang-ep":
        out.append(("--moe-a2a-backend deepep", "tokens dispatched to their experts' GPUs by "
                                                "DeepEP all-to-all (default none)"))
    if r:
        out.append((f"--ep-num-redundant-experts {r}", f"{r} replica slots per layer (default 0)"))
    if placement_file is not None:
        out.append((f"--init-expert-location {placement_file}",
                    f"the {v.placement} placement (default trivial: experts in id order)"))
    return out


def placement_lines(v: Variant, G: int, nodes: int, trace: str, placement, seed: int = 0
                    ) -> tuple[list[str], list[str], str | None]:
    """(`sempar place` and, when the exporter accepts the placement, `sempar export` lines;
    `#` notes; the SGLang placement file the launch loads, or None)."""
    r = v.redundant_slots(G)
    homes = placement.info.get("homes")         # the home rule sempar solved for
    lines = [shlex.join(["sempar", "place", "--trace", trace, "--fit-fraction",
                         str(FIT_FRACTION), "--seed", str(seed), "--method", v.placement,
                         "--ep", str(G), "--nodes", str(nodes), "--redundant", str(r),
                         *(["--homes", homes] if homes else []), "--out", "placement.json"])]
    try:
        check_exportable(placement, "sglang", "expert-location.json")
    except InputError as e:             # the exporter's own refusal, said instead of run
        return lines, [f"# no SGLang placement file: {e} -- the placement needs an engine that "
                       "loads it (e.g. a checkpoint permuted by `sempar export --to "
                       "hf-checkpoint`)"], None
    export = ["sempar", "export", "--placement", "placement.json", "--to", "sglang",
              "--out", "expert-location.json"]
    if placement.info.get("num_hidden_layers") is None:
        export += ["--num-hidden-layers", str(placement.num_layers)]
    return lines + [shlex.join(export)], [], "expert-location.json"


def commands(v: Variant, G: int, nodes: int, trace: str, model: str, placement, seed: int = 0
             ) -> list[str]:
    """The lines to print, in the order they run: `sempar place` / `export` (when the
    placement is not the engine's own), the launch line with a `#` line per flag's reason,
    what needs more than SGLang, and the `sempar router` line in front of the DP ranks when
    the request policy is not SGLang's round-robin. `placement`: the Placement the plan scored
    (its info says the model's layout)."""
    pipe = PIPELINES.get(v.pipeline)
    # SGLang places requests round-robin; any other policy is `sempar router` in front of the DP
    # ranks, reading the placement file's token tables (so the file is written even if vanilla).
    routed = pipe.attention == "dp" and v.policy != "round-robin"
    out, notes, location = [], [], None
    if v.placement != "vanilla" or v.redundant_slots(G) or routed:
        out, notes, location = placement_lines(v, G, nodes, trace, placement, seed)
    flags = engine_flags(v, G, location)
    out.append("python -m sglang.launch_server --model-path " + shlex.quote(model_path(model))
               + " " + " ".join(f for f, _ in flags))
    out += [f"#   {f}: {why}" for f, why in flags]
    if placement is not None and placement.info.get("solved_on_rows"):
        notes.append(f"# the forecast solved this placement on {placement.info['solved_on_rows']} "
                     "of the fit split's rows (a time budget); `sempar place` above solves on "
                     "all of them")
    out += notes
    if v.pipeline not in UPSTREAM_PIPELINES:
        out.append(f"# pipeline {v.pipeline} is not an upstream SGLang mode: it needs an engine "
                   "that runs it (sempar's runtime measures it with `sempar bench`)")
    if routed:
        line = router_command("placement.json", "http://127.0.0.1:30000", "sglang", G,
                              model_path(model), policy=v.policy)
        out += [line] if line else []
    return out
