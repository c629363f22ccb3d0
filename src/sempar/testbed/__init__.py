"""Network-namespace testbed (netns), rank launcher (launch), two-phase alpha-beta profiler
(profiler, CAMoE Appendix A.1 Alg. 1) and all-to-all fidelity check (fidelity)."""
