"""docs/inspect_remat.ipynb runs top to bottom in a real Jupyter kernel (its cells assert)."""

import pytest

from pathlib import Path

import nbformat
from nbclient import NotebookClient

pytestmark = pytest.mark.jit

NOTEBOOK = Path(__file__).parent.parent / "docs" / "inspect_remat.ipynb"


def test_notebook_executes(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "thunder_remat report" in text and "budget 0.5" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert (tmp_path / "tradeoff.png").exists()
