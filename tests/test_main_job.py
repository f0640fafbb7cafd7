"""The README's main job, end to end on the smallest model; its outputs exist and parse."""

import json
import re

import pytest

from thunder_remat.__main__ import main

pytestmark = pytest.mark.jit


def test_main_job_prints_table_and_writes_outputs(capsys, tmp_path):
    out_dir = tmp_path / "out"
    assert main(["--model", "mlp", "--size", "tiny", "--executor", "eager", "--budget", "0.5",
                 "--output-dir", str(out_dir)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    first = lines[1]  # under the header: the activation bytes held, Thunder vs thunder_remat and the ratio
    assert first.startswith("activation bytes held for backward") and re.search(r"\(\d+\.\d\dx\)", first)
    assert lines[2].strip().startswith("with parameters and inputs")
    assert any("parameters and inputs are held anyway" in line for line in lines)
    assert "gradients equal to the run without the pass" in captured.out and "yes" in captured.out
    assert "[3/3]" in captured.err
    report = json.loads((out_dir / "report.json").read_text())
    assert report["budget"].startswith("fraction 0.5") and report["saved"]
    assert all(v["reason"] for v in report["saved"])
    sweep = json.loads((out_dir / "sweep.json").read_text())
    assert [p["budget"] for p in sweep][0] == 1.0 and len(sweep) == 11
    assert (out_dir / "tradeoff.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    plotted = json.loads(Image.open(out_dir / "tradeoff.png").text["Description"])
    assert plotted[-1]["budget"] == "Thunder without thunder_remat"
    assert plotted[-1]["saved_bytes"] == report["activation_bytes_before"] > 0
    assert (out_dir / "cut.dot").read_text().startswith("digraph")
    compile((out_dir / "forward_trace.py").read_text(), "forward_trace.py", "exec")
    compile((out_dir / "backward_trace.py").read_text(), "backward_trace.py", "exec")
    assert "saved for backward" in (out_dir / "report.txt").read_text()


def test_main_job_rejects_unknown_model(capsys):
    with pytest.raises(SystemExit):
        main(["--model", "resnet"])
    assert "invalid choice: 'resnet'" in capsys.readouterr().err


def test_main_job_rejects_bad_budget(capsys):
    with pytest.raises(SystemExit):
        main(["--budget", "lots"])
    assert "remat_memory_budget" in capsys.readouterr().err


def test_main_job_with_measured_costs(capsys, tmp_path):
    out_dir = tmp_path / "measured"
    assert main(["--model", "mlp", "--size", "tiny", "--budget", "0.5", "--cost-model", "measured",
                 "--output-dir", str(out_dir)]) == 0
    assert "est. recompute (us)" in capsys.readouterr().out
    report = json.loads((out_dir / "report.json").read_text())
    assert report["recompute_unit"] == "us"
    assert {p["unit"] for p in json.loads((out_dir / "sweep.json").read_text())} == {"us"}


def test_main_job_runs_attention_as_one_op_by_default(capsys, tmp_path):
    from thunder_remat.executors.cpu_attention import FORWARD_NAME

    assert main(["--model", "gpt", "--size", "tiny", "--output-dir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "attention fused" in captured.err and "yes" in captured.out
    assert FORWARD_NAME in (tmp_path / "forward_trace.py").read_text()
