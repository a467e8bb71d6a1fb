import os
import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "parity.ipynb"
RESULTS = Path(__file__).parent / "fixtures" / "results.jsonl"


def _execute(monkeypatch, **env):
    monkeypatch.setenv("PARITY_RESULTS", str(RESULTS))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTHONPATH", str(NOTEBOOK.parents[1]) + os.pathsep
                       + os.environ.get("PYTHONPATH", ""))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return outputs


def _text(outputs, kind):
    if kind == "stream":
        return "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    return "".join(str(o.get("data", {}).get(kind, "")) for o in outputs)


def test_notebook_executes_headless_on_the_fixture(monkeypatch):
    monkeypatch.delenv("PARITY_ARMS", raising=False)
    monkeypatch.delenv("PARITY_QUERY", raising=False)
    outputs = _execute(monkeypatch)
    assert "rel_l2 vs exact" in _text(outputs, "text/markdown")
    assert "**FAIL** 5.98e-01" in _text(outputs, "text/markdown")  # the summary
    assert "baseline peft-decoder; 16 of 16 cells shown" in _text(outputs, "stream")
    # speedup, step times, sweep (two sequence lengths), memory
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 4


def test_the_cell_table_filters_by_arm_and_query(monkeypatch):
    outputs = _execute(monkeypatch, PARITY_ARMS="engine,peft-decoder", PARITY_QUERY="ga == 2")
    assert "baseline peft-decoder; 4 of 16 cells shown" in _text(outputs, "stream")
    html = _text(outputs, "text/html")
    styled = html[:html.index("</table>")]  # the filtered, styled cell table comes first
    # Rows 0-3: engine, peft-decoder at s16 then s32 (ga 2); the two FAIL rows are marked.
    style = styled[:styled.index("</style>")]
    assert "background-color: #f8d0d0" in style
    assert {int(n) for n in re.findall(r"_row(\d+)_col", style)} == {1, 3}
    assert "native" not in styled and "tiny s16 b4 ga2 float32" in styled
