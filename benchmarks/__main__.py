"""Entry point: ``python -m benchmarks [options]`` (``--help`` lists them)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
