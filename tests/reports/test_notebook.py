import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "parity.ipynb"
RESULTS = Path(__file__).parent / "fixtures" / "results.jsonl"


def test_notebook_executes_headless_on_the_fixture(monkeypatch):
    monkeypatch.setenv("PARITY_RESULTS", str(RESULTS))
    monkeypatch.setenv("PYTHONPATH", str(NOTEBOOK.parents[1]) + os.pathsep
                       + os.environ.get("PYTHONPATH", ""))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(str(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert "rel_l2 vs exact" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 3
