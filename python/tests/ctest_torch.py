"""CTest's way into the PyTorch operator's tests (python/tests): exit 77, which CTest shows as skipped,
with one line saying what is missing (PyTorch, a CUDA GPU, the built package); otherwise pytest's
verdict. CI has no PyTorch: there the line is `PyTorch operator: skipped, no PyTorch`.
"""
import importlib.util
import os
import subprocess
import sys


def main() -> int:
    if importlib.util.find_spec("torch") is None:
        print("PyTorch operator: skipped, no PyTorch")
        return 77
    import torch
    if not torch.cuda.is_available():
        print("PyTorch operator: skipped, no CUDA GPU")
        return 77
    try:
        import flashcourse  # noqa: F401
    except ImportError as e:
        print(f"PyTorch operator: skipped, the package is not built ({e})")
        return 77
    return subprocess.call([sys.executable, "-m", "pytest", "-q", os.path.dirname(os.path.abspath(__file__))])


if __name__ == "__main__":
    sys.exit(main())
