"""What the engine-balancer tests share besides fixtures: the engine shape and the broken
FILEs every plug-in must fall back on."""

from __future__ import annotations

from pathlib import Path

G, R = 4, 4


def broken_files(files, tmp_path: Path) -> dict[str, tuple[Path, dict]]:
    """name -> (FILE, extra environment): every case the plug-in must fall back on."""
    import json
    import os

    from sempar.placement.placement import Placement

    out: dict[str, tuple[Path, dict]] = {}
    out["missing"] = (tmp_path / "nope.stats", {})
    bad = tmp_path / "corrupt.stats"
    raw = bytearray(files["stats"].read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad.write_bytes(bytes(raw))
    out["corrupt"] = (bad, {})
    cut = tmp_path / "truncated.stats"
    cut.write_bytes(files["stats"].read_bytes()[: len(raw) // 3])
    out["truncated"] = (cut, {})
    half = tmp_path / "truncated.json"
    half.write_text(files["placement"].read_text()[:200])
    out["truncated-json"] = (half, {})
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    out["garbage"] = (garbage, {})
    old = tmp_path / "stale.stats"
    old.write_bytes(files["stats"].read_bytes())
    os.utime(old, (1e9, 1e9))
    out["stale"] = (old, {"SEMPAR_EPLB_MAX_AGE_S": "3600"})
    out["other-model"] = (files["stats"], {"SEMPAR_EPLB_MODEL": "deepseek-ai/DeepSeek-V3"})
    p = Placement.load(files["placement"])
    for name, pl in (("other-layers", Placement(p.phy2log[:-1], p.num_experts, p.num_devices,
                                                 info=p.info)),
                     ("other-ep", Placement(p.phy2log, p.num_experts, 2, info=p.info))):
        path = tmp_path / f"{name}.json"
        pl.save(path)
        out[name] = (path, {})
    ex = tmp_path / "other-experts.json"
    d = json.loads(files["placement"].read_text())
    d["phy2log"] = [row[:-4] for row in d["phy2log"]]      # 60 experts
    d["num_experts"] = 60
    d.pop("slots_per_device", None)
    ex.write_text(json.dumps(d))
    out["other-experts"] = (ex, {})
    out["bad-knob"] = (files["stats"], {"SEMPAR_EPLB_MAX_MOVES": "many"})
    return out
