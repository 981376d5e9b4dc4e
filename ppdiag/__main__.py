from __future__ import annotations

from ppdiag.cli import main

main()
