"""The README's main job, end to end on the smallest model."""

import pytest

from thunder_remat.__main__ import main


def test_main_job_prints_table(capsys):
    assert main(["--model", "mlp", "--size", "tiny", "--executor", "eager"]) == 0
    out = capsys.readouterr().out
    assert "bytes saved for backward" in out
    assert "gradients equal to the run without the pass" in out and "yes" in out


def test_main_job_rejects_unknown_model(capsys):
    with pytest.raises(SystemExit):
        main(["--model", "resnet"])
    assert "invalid choice: 'resnet'" in capsys.readouterr().err
