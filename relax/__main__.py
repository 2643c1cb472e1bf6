"""``python -m relax`` is the same as the ``relax`` console script."""

from relax.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
