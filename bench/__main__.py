"""``python -m bench``: run the benchmark."""

from .cli import main

raise SystemExit(main())
