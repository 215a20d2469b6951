"""`python -m rlspeed ...` (also what torchrun launches) runs the CLI."""

from rlspeed.cli import main

raise SystemExit(main())
