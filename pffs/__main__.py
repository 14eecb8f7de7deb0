"""`python -m pffs` is the `pffs` command."""

from pffs.cli import main

raise SystemExit(main())
