"""``python -m gradian`` (also what ``torchrun -m gradian`` runs)."""

from gradian.cli.app import main

raise SystemExit(main())
