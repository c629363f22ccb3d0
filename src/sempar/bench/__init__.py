"""`sempar bench`'s orchestration: real expert-parallel prefills of a tiny 64-expert model, vanilla
vs exflow vs sempar, on the namespace testbed (root) or over loopback; `sempar.runtime` executes.

- inputs.py: the dev trace's splits, prefill batches of its held-out requests (the 80 % not used
  to fit, each cut to its first `seq` tokens), the single-process reference forward;
- plan.py: the methods (placement, runtime mode, scheduling) and the RunSpecs, the simulator's
  prediction for each run;
- run.py: `run_bench` (the `bench --json` object) and `execute` (testbed or loopback);
- result.py: figures, their summary per method, the saved last result and its table rows.

Per method and batch the runtime reports min over `repeats` forwards; the figures are the median
over batches (times), sums (bytes), mean (LAR) and max (logit diff).
"""

from sempar.bench.inputs import tp_ok
from sempar.bench.plan import BASELINE, METHODS
from sempar.bench.result import TABLE_HEADER, bench_table_rows, last_bench_result, result_path
from sempar.bench.run import MODEL, run_bench

__all__ = ["BASELINE", "METHODS", "MODEL", "TABLE_HEADER", "bench_table_rows",
           "last_bench_result", "result_path", "run_bench", "tp_ok"]
