"""First cell of every notebook: ``from _setup import *``.

* puts the repository root on ``sys.path``, so the notebooks import ``flash_attention_py`` (and the
  Triton / CUDA packages) from a plain checkout, without ``pip install -e .``;
* says whether there is a CUDA GPU (``HAS_GPU``) and, when there is none, sets
  ``TRITON_INTERPRET=1`` so that Triton kernels run on the CPU under Triton's interpreter
  (it must be set before ``flash_attention_triton`` is first imported);
* ``skip(what)`` prints one line saying which GPU-only step a CPU run leaves out;
* ``check(answer, test, correct, hint)`` gives feedback on an exercise ("Correct: ..." or "Not yet: ...")
  and never raises, so a notebook with the worked answers removed still runs top to bottom;
* ``RESULTS`` is ``docs/results/``, where the measurements recorded on an H100 live, and
  ``recorded(relpath)`` reads one of its JSON files (None when it is missing).
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from flash_attention_triton.capabilities import use_interpreter_without_gpu  # noqa: E402 (imports no triton)

HAS_GPU = use_interpreter_without_gpu()  # no GPU: TRITON_INTERPRET=1, before any kernel is imported
DEVICE = "cuda" if HAS_GPU else "cpu"


def skip(what: str) -> None:
    """Say what a CPU-only run leaves out (GPU cells call this instead of failing)."""
    print(f"[skipped: no CUDA GPU] {what}")


def describe_machine() -> str:
    if HAS_GPU:
        import torch

        return f"GPU: {torch.cuda.get_device_name(0)} (torch {torch.__version__})"
    return "CPU only: GPU cells will print what they skip; Triton runs under TRITON_INTERPRET=1"


def check(answer, test, correct: str, hint: str) -> None:
    """Exercise feedback. ``test(answer)`` decides; prints "Correct: <correct>" or "Not yet: <hint>".

    ``answer`` None means the exercise is not done yet. Never raises: an exception inside ``test`` (a
    wrong shape, a function that returns None, ...) is reported as "Not yet" with its message.
    """
    if answer is None:
        print(f"Not yet: `answer` is still None. {hint}")
        return
    try:
        ok = bool(test(answer))
    except Exception as exc:  # a half-written answer: say what went wrong, do not stop the notebook
        ok = False
        hint = f"{hint} (checking your answer raised {type(exc).__name__}: {exc})"
    print(f"Correct: {correct}" if ok else f"Not yet: {hint}")


def recorded(relpath: str):
    """The JSON file ``docs/results/<relpath>`` (measured on an H100 and committed), or None if absent."""
    path = RESULTS / relpath
    if not path.exists():
        print(f"no recorded results at {path}")
        return None
    return json.loads(path.read_text())


__all__ = ["ROOT", "RESULTS", "HAS_GPU", "DEVICE", "skip", "describe_machine", "check", "recorded"]
