"""Routing predictors fitted on a trace: token -> expert (Cp), token -> device (T, Tp), device n-grams (A, Ap)."""
