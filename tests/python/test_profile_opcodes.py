"""scripts/profile_opcodes.py: ncu source pages summed by opcode, stall and times executed."""
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "profile_opcodes.py")
HEADER = '"Address","Source","Instructions Executed","stall_long_sb","stall_barrier"\n'


def page(tmp_path, rows):
    """An ncu source page: the kernel's name, the header, then (source, executed, long_sb,
    barrier) rows."""
    path = tmp_path / "k_sass.csv"
    body = "".join(f'"0x{i:x}","{src}","{n}","{a}","{b}"\n' for i, (src, n, a, b) in
                   enumerate(rows))
    path.write_text('"Kernel Name","decode"\n' + HEADER + body)
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def test_instructions_are_grouped_by_times_executed_with_their_samples(tmp_path):
    # 8 units: two instructions once a unit, one once every two units, one executed never.
    path = page(tmp_path, [
        ("FFMA R0, R1, R2, R0", 8, 1, 0),
        ("@P0 HMMA.16816 R4, R8, R10, R4", 8, 0, 0),
        ("LDG.E R3, desc[UR4][R6.64]", 4, 6, 2),
        ("EXIT", 0, 0, 1),
    ])
    r = run("8", path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "by times executed" in line)
    groups = [line.split() for line in lines[start + 1:]]
    # per unit, instructions, executed %, samples, samples %; most executed work first
    assert groups[0] == ["1.0000", "2", "80.0", "1", "10.0"]
    assert groups[1] == ["0.5000", "1", "20.0", "8", "80.0"]
    assert groups[2] == ["0.0000", "1", "0.0", "1", "10.0"]
    rows = [line.split() for line in lines[:start]]
    assert ["FFMA", "1.00"] in rows and ["HMMA", "1.00"] in rows and ["LDG", "0.50"] in rows
    assert ["long_sb", "7"] in rows and ["barrier", "3"] in rows


def test_a_file_that_is_not_a_source_page_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    r = run("8", str(path))
    assert r.returncode != 0 and "not an ncu source page" in r.stderr
    assert run("0", str(path)).returncode != 0
