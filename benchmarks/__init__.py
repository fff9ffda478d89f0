"""The project's benchmark: ``python -m benchmarks`` (see benchmarks/README.md and ``--help``).

It reads the backend registry (``flash_attention_py.registry.BACKENDS``), so a new backend is timed as
soon as it has an entry, and adds PyTorch's own kernels as anchors: naive ``softmax(QK^T)V``
(``naive-torch``) and ``scaled_dot_product_attention`` pinned to each SDPA kernel. ``--preset NAME`` runs a
named comparison (``benchmarks/presets.py``: cuda-ladder, cuda-backward, triton-vs-fa2, launch-overhead)
through the same sweep and the same timer (``benchmarks/measure.py``).
"""


def main(argv=None):
    """Run the benchmark command with ``argv`` (a list of strings; None: sys.argv[1:]); returns 0."""
    from .cli import main as _main

    return _main(argv)


__all__ = ["main"]
