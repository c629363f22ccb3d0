"""Affinity statistics of routing traces: the papers' tables and token -> expert predictors."""
