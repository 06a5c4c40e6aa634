"""scripts/plot_decode_bench.py: the decode bench's plot from its JSON (no kvtier module)."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "plot_decode_bench.py")
NS = "{http://www.w3.org/2000/svg}"
CASES = ["fp16", "fp8_e4m3_block_head", "nvfp4_block_head", "balanced_mix", "fp16_tail_nvfp4",
         "fp16_tail_fp8"]


def bench(tmp_path, name, rows, gpu="Test GPU"):
    path = tmp_path / name
    path.write_text(json.dumps({"gpu": gpu, "date": "2026-12-07T00:00:00Z", "decode": rows}))
    return str(path)


def row(case, batch, ctx_k, variant, pct, us=10.0):
    return {"name": f"decode_{case}_b{batch}_ctx{ctx_k}k_splits4{variant}",
            "pct_of_read_roof": pct, "median_ms": us / 1e3}


def full_rows(pct):
    rows = []
    for case in CASES:
        rows += [row(case, b, 32, "", pct) for b in (1, 8, 64, 256)]
        rows += [row(case, 1, k, "_back_to_back", pct) for k in (1, 8, 32, 128)]
        rows.append(row(case, 1, 8, "_graph", pct, us=11.5))
    return rows


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def test_two_files_draw_a_line_a_format_and_file_in_each_line_panel(tmp_path):
    a = bench(tmp_path, "a.json", full_rows(50.0), gpu="GPU A")
    b = bench(tmp_path, "b.json", full_rows(80.0), gpu="GPU B")
    out = tmp_path / "plot.svg"
    r = run(str(out), a, b)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    svg = ET.parse(out).getroot()
    assert len(svg.findall(f"{NS}polyline")) == 2 * 2 * len(CASES)
    texts = [t.text for t in svg.iter(f"{NS}text")]
    assert any("GPU A" in t for t in texts) and any("GPU B" in t for t in texts)
    assert texts.count("11.5") == 2 * len(CASES)  # a bar a (format, file), labelled in us


def test_a_value_maps_to_its_height(tmp_path):
    out = tmp_path / "plot.svg"
    assert run(str(out), bench(tmp_path, "a.json", full_rows(50.0))).returncode == 0
    svg = ET.parse(out).getroot()
    ys = {float(p.split(",")[1]) for line in svg.findall(f"{NS}polyline")
          for p in line.get("points").split()}
    assert len(ys) == 1  # 50% everywhere: one height, halfway down a panel
    frame = [r for r in svg.findall(f"{NS}rect") if r.get("stroke") == "#999"][0]
    top, height = float(frame.get("y")), float(frame.get("height"))
    assert abs(ys.pop() - (top + height / 2)) < 0.2


def test_missing_shapes_are_left_out_and_listed(tmp_path):
    rows = [r for r in full_rows(60.0) if "_b256_" not in r["name"]]
    out = tmp_path / "plot.svg"
    r = run(str(out), bench(tmp_path, "a.json", rows))
    assert r.returncode == 0
    assert r.stderr.count("no row for") == len(CASES)
    assert "nvfp4_block_head (256, 32, '')" in r.stderr
    svg = ET.parse(out).getroot()
    first_panel = svg.findall(f"{NS}polyline")[:len(CASES)]
    assert all(len(p.get("points").split()) == 3 for p in first_panel)


def test_a_file_without_decode_rows_writes_nothing(tmp_path):
    out = tmp_path / "plot.svg"
    r = run(str(out), bench(tmp_path, "a.json", []))
    assert r.returncode == 2
    assert "no decode rows" in r.stderr
    assert not out.exists()
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"name": "decode_fp16_b1_ctx8k_splits4"}]))
    r = run(str(out), str(other))
    assert r.returncode == 2 and "not a kvtier_gpu_bench JSON" in r.stderr and not out.exists()
    r = run(str(out), str(tmp_path / "absent.json"))
    assert r.returncode == 2 and "cannot read" in r.stderr and not out.exists()
    assert run(str(out)).returncode == 2 and "usage" in run(str(out)).stderr
