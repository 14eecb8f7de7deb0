"""`python -m pffs` is the `pffs` command."""

from pffs.cli.main import main

raise SystemExit(main())
