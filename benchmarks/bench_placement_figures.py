"""Figures shared by `bench_placement.py` and `bench_placement_real.py` (one home, so neither
imports the other): our method's name and which figures a verdict judges."""

OURS = "sempar"
# Which figure a verdict judges: a method's own homes (its token table, else vanilla's), or
# exact pre-routing (the capacity-bound oracle's homes of the same placement, evaluate.figures_for).
FIGURES = {"method": ("lar_mean", "imbalance_max_mean"),
           "exact": ("oracle_lar_mean", "oracle_imbalance_max_mean")}
