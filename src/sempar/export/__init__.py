"""Writers for engines and checkpoints: placements in the files SGLang, vLLM and HF load."""
