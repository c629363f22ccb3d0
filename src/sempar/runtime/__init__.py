"""Real expert-parallel execution of HF MoE models over torch.distributed (issue #7 item 1).

Modes (`DISPATCHERS`, one dispatcher class each, naming its simulator pipeline): attn-dp,
tp-allreduce, tp-rebatch (Sem-MoE §3.4 Alg. 3), tp-exact, exflow (ExFlow §IV-A); experts loaded
per a Placement (replicas allowed); one-shot de-duplicated all2allv dispatch / combine (s-MoE §4)
with exact per-pair byte counters. See modes.py, dispatch.py, run.py.
"""

from sempar.runtime.dist import RankFailure
from sempar.runtime.modes import DISPATCHERS, MODES
from sempar.runtime.run import RunResult, RunSpec, reference_logits, run, run_many

__all__ = ["DISPATCHERS", "MODES", "RankFailure", "RunResult", "RunSpec", "reference_logits", "run",
           "run_many"]
