"""python -m flamia.train: the same as ``flamia train``."""
from .cli import main

main()
