"""The Triton and Gluon kernels. Importing any of them applies the interpreter's workarounds
that patch Triton itself (``fp8.py``)."""
from . import fp8 as _fp8  # noqa: F401
