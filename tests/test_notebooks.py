"""Every notebook of the learning path (notebooks/NN_*.ipynb) runs top to bottom, and is committed clean.

* ``test_notebook_runs``: executes the notebook with nbclient in a fresh kernel of this interpreter
  (kernel ``python3``: jupyter_client starts it with ``sys.executable``), working directory
  ``notebooks/``, with ``MPLBACKEND=Agg`` and, without a GPU, ``TRITON_INTERPRET=1``. Any cell that
  raises fails the test with the cell's traceback. 300 s per notebook at most.
* ``test_committed_without_outputs``: no outputs and no execution counts in the committed JSON
  (clear them with ``jupyter nbconvert --clear-output --inplace notebooks/*.ipynb``).

On a CPU-only machine the GPU cells print what they skip; the whole set takes about two minutes on
two cores. Labs (``notebooks/labs/``) have their own tests.
"""
from __future__ import annotations

import os
import pathlib
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = pathlib.Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(p.name for p in NB_DIR.glob("[0-9][0-9]_*.ipynb"))
TIMEOUT_S = 300


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def test_the_learning_path_is_complete():
    numbers = [name[:2] for name in NOTEBOOKS]
    assert numbers == [f"{i:02d}" for i in range(1, len(NOTEBOOKS) + 1)], f"notebooks are not numbered 01..N: {NOTEBOOKS}"
    assert len(NOTEBOOKS) >= 8, f"expected the 8 notebooks of the learning path, found {NOTEBOOKS}"
    readme = (NB_DIR / "README.md").read_text()
    missing = [name for name in NOTEBOOKS if name not in readme]
    assert not missing, f"notebooks/README.md does not link {missing}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs(name):
    nb = nbformat.read(str(NB_DIR / name), as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, cell in enumerate(nb.cells)
             if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{name}: code cells {dirty} carry outputs; clear them with "
                       f"`jupyter nbconvert --clear-output --inplace notebooks/{name}`")


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    if not _has_cuda():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    # the kernel imports the repository through notebooks/_setup.py; PYTHONPATH too, for good measure
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(str(NB_DIR / name), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(NB_DIR)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    print(f"{name}: executed in {seconds:.1f} s")
    assert seconds < TIMEOUT_S, f"{name} took {seconds:.0f} s (limit {TIMEOUT_S} s)"
    errors = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
              if out.get("output_type") == "error"]
    assert not errors, f"{name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
