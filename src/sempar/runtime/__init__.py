"""Real expert-parallel execution of HF MoE models over torch.distributed (issue #7 item 1).

Modes: attn-dp, tp-allreduce, tp-rebatch (Sem-MoE §3.4 Alg. 3), exflow (ExFlow §IV-A); experts
loaded per a Placement (replicas allowed); one-shot de-duplicated all2allv dispatch / combine
(s-MoE §4) with exact per-pair byte counters. See modes.py, dispatch.py, run.py.
"""

from sempar.runtime.dist import RankFailure
from sempar.runtime.modes import MODES
from sempar.runtime.run import RunResult, RunSpec, reference_logits, run, run_many

__all__ = ["MODES", "RankFailure", "RunResult", "RunSpec", "reference_logits", "run", "run_many"]
