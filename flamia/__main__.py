"""python -m flamia: the same as the ``flamia`` command."""
from .cli import main

raise SystemExit(main())
