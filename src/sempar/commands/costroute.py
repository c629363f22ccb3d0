"""`sempar cost-route`: CAMoE's cost-aware routing (issue 6 item 4).

    sempar cost-route sweep --model tiny-moe64 --topology hetero-cloud --ep 8 \\
        --corpus DIR [--lambdas 0,0.05,0.1,0.15,0.2,0.25] [--json] [--plot DIR]
    sempar cost-route tables --model tiny-moe64 --topology pcie-upi8 --ep 8 --corpus DIR --out t.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from sempar.bounds import Bounds, NumberList, bound
from sempar.commands._options import ep_option, json_option
from sempar.console import emit_json, out
from sempar.errors import InputError, check_choice

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Cost-aware routing (CAMoE): gate bias from the topology, lambda sweep.")


LAMBDAS = NumberList("--lambdas", Bounds(0, 1e6))      # a gate-bias weight; each one a pass


def _lambdas(text: str) -> tuple[float, ...]:
    return tuple(LAMBDAS.parse(text) or ())


def _config(topology: str, lambdas: str, text, **fields):
    """The SweepConfig of the verb's options: `fields` are SweepConfig's own (model, ep,
    corpus, tokens_per_domain, seq_len, batch_size, placement, dedup, mode, token_bytes,
    max_acc_loss); the topology list, lambdas and texts are parsed here."""
    from sempar.costroute.hook import BIAS_MODES
    from sempar.costroute.sweep import SweepConfig

    check_choice("--mode", fields["mode"], BIAS_MODES)
    return SweepConfig(topologies=tuple(t.strip() for t in topology.split(",") if t.strip()),
                       lambdas=_lambdas(lambdas), texts=tuple(text or ()), **fields)


_MODEL = typer.Option("tiny-moe64", "--model", help="model folder or packaged name")
_TOPO = typer.Option("hetero-cloud", "--topology", help="preset(s) or JSON, comma-separated")
_EP = ep_option(8, "EP degree G (= the topology's devices)")
_LAMS = typer.Option("0,0.05,0.1,0.15,0.2,0.25", "--lambdas", help="lambda_cost values",
                     callback=LAMBDAS.callback)
_CORPUS = typer.Option(None, "--corpus", help="corpus folder (held-out text); or $SEMPAR_CORPUS")
_TEXT = typer.Option(None, "--text", help="FILE[:DOMAIN] instead of the corpus (repeatable)")
_TPD = typer.Option(4096, "--tokens-per-domain", help="cap on held-out tokens per domain",
                    callback=bound(1, 10_000_000))
_SEQ = typer.Option(256, "--seq-len", help="tokens per sequence (request)",
                    callback=bound(1, 65536))
_BATCH = typer.Option(None, "--batch-size", help="sequences per forward (default 2 x ep)",
                      callback=bound(1, 65536))
_PLACE = typer.Option("vanilla", "--placement", help="vanilla, round-robin or a placement JSON")
_DEDUP = typer.Option(False, "--dedup", help="one dispatch copy per (token, device)")
_MODE = typer.Option("logits", "--mode", help="logits (CAMoE) or select (bias only the choice)")
_TB = typer.Option(None, "--token-bytes", help="bytes of one hidden state (default hidden x 2)",
                   callback=bound(1, 2**30))
_LOSS = typer.Option(1.2, "--max-acc-loss", help="accuracy budget (points) of the Pareto point",
                     callback=bound(0, 100))


def register(main_app: typer.Typer) -> None:
    main_app.add_typer(app, name="cost-route")


@app.command("sweep")
def sweep(model: str = _MODEL, topology: str = _TOPO, ep: int = _EP, lambdas: str = _LAMS,
          corpus: Optional[Path] = _CORPUS, text: Optional[list[str]] = _TEXT,
          tokens_per_domain: int = _TPD, seq_len: int = _SEQ, batch_size: Optional[int] = _BATCH,
          placement: str = _PLACE, dedup: bool = _DEDUP, mode: str = _MODE,
          token_bytes: Optional[int] = _TB, max_acc_loss: float = _LOSS,
          as_json: bool = json_option("one JSON object on stdout"),
          plot: Optional[Path] = typer.Option(None, "--plot", help="folder for pareto.png")) -> None:
    """Run the model on held-out text at every lambda: all-to-all mean/p95, routing shift, quality."""
    from sempar.progress import steps
    from sempar.costroute.report import (COLUMNS, layer_rows, pareto_line, pareto_plot,
                                       table_rows)
    from sempar.costroute.sweep import run_sweeps, validate_config

    cfg = _config(topology, lambdas, text, model=model, ep=ep, corpus=corpus,
                  tokens_per_domain=tokens_per_domain, seq_len=seq_len, batch_size=batch_size,
                  placement=placement, dedup=dedup, mode=mode, token_bytes=token_bytes,
                  max_acc_loss=max_acc_loss)
    validate_config(cfg)
    if plot is not None:
        from sempar.atomic import check_output

        check_output(Path(plot) / "pareto.png", corpus, option="--plot")
    n = 3 + (len(cfg.checked_lambdas()) - 1) * len(cfg.topologies)
    with steps("cost-route", n) as step:
        results = run_sweeps(cfg, progress=step)
    if plot is not None:
        pareto_plot(results, Path(plot) / "pareto.png")
    if as_json:
        emit_json({"model": results[0]["model"], "ep": ep, "sweeps": results})
        return
    from rich.table import Table

    for r in results:
        t = Table(title=f"{r['model']} on {r['topology']} (EP {r['ep']}, {r['placement']}, "
                        f"{r['tokens']} tokens, {r['forwards']} forwards)")
        for c in COLUMNS:
            t.add_column(c, justify="right")
        for row in table_rows(r):
            t.add_row(*row)
        out.print(t)
        lt = Table(title="per layer: mean/p95 all-to-all change (%)")
        lt.add_column("layer")
        for p in r["points"][1:]:
            lt.add_column(f"lambda {p['lambda']:g}", justify="right")
        for row in layer_rows(r):
            lt.add_row(*row)
        out.print(lt)
        out.print(pareto_line(r))
    if plot is not None:
        sys.stderr.write(f"wrote {Path(plot) / 'pareto.png'}\n")


@app.command("tables")
def tables(model: str = _MODEL, topology: str = _TOPO, ep: int = _EP,
           corpus: Optional[Path] = _CORPUS, text: Optional[list[str]] = _TEXT,
           tokens_per_domain: int = _TPD, seq_len: int = _SEQ,
           batch_size: Optional[int] = _BATCH, placement: str = _PLACE, dedup: bool = _DEDUP,
           token_bytes: Optional[int] = _TB,
           out_path: Path = typer.Option(..., "--out", help="JSON file for the tables")) -> None:
    """One-shot traffic accounting (lambda = 0) -> the unit gate-bias tables (eqs. 10-13) as JSON:
    G(l) for a lambda is lambda x unit[l]."""
    from sempar.atomic import write_text_atomic
    from sempar.comm.topology_presets import load_topology
    from sempar.models import load_model, resolve_model
    from sempar.costroute.cost_bias import TokenBytes, build_tables, destination_table
    from sempar.costroute.hook import CostRoutingHook
    from sempar.costroute.passes import per_batch_counts, run_pass
    from sempar.costroute.sweep import make_hosts
    from sempar.costroute.text import load_sequences
    from sempar.trace.routers import trace_meta_for

    from sempar.atomic import check_output

    check_output(out_path)
    cfg = _config(topology, "0", text, model=model, ep=ep, corpus=corpus,
                  tokens_per_domain=tokens_per_domain, seq_len=seq_len, batch_size=batch_size,
                  placement=placement, dedup=dedup, mode="logits", token_bytes=token_bytes,
                  max_acc_loss=1.2)
    if len(cfg.topologies) != 1:
        raise InputError("--topology: give exactly one for `tables`")
    topo = load_topology(cfg.topologies[0])
    if topo.num_devices != ep:
        raise InputError(f"--topology {topo.name} has {topo.num_devices} devices, --ep is {ep}")
    src = resolve_model(model)
    seqs = load_sequences(cfg, src.tokenizer_path)
    m = load_model(src.model_dir)
    hook = CostRoutingHook(m, None)
    meta = trace_meta_for(m, hook.sites, src.name)
    hosts, _ = make_hosts(placement, meta.num_layers, meta.num_experts, topo)
    nb = TokenBytes.for_option(int(m.config.hidden_size), meta.top_k, meta.num_experts, token_bytes)
    bs = batch_size or 2 * ep
    base = run_pass(m, seqs, hook, ep, bs)
    dest = destination_table(hosts, topo, nb.dispatch)
    t = build_tables(topo, hosts, per_batch_counts(base, dest, bs, dedup).mean(0), nb, dest)
    write_text_atomic(out_path, json.dumps({
        "model": src.name, "topology": topo.name, "ep": ep, "placement": placement,
        "bytes": nb.to_json(), "unit": t.unit.tolist(), "c_tw": t.c_tw.tolist(),
        "n_disp": t.n_disp.tolist()}) + "\n")
    sys.stderr.write(f"wrote {out_path} ({t.num_layers} layers x {t.num_devices} devices x "
                     f"{t.num_experts} experts; {t.nbytes_fp16()} bytes in fp16)\n")
