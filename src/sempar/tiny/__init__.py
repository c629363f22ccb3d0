"""Tiny MoE language models trained on this CPU, the source of our real routing traces."""
