"""``python -m relax`` is the same as the ``relax`` console script."""

from relax.cli import main

if __name__ == "__main__":
    # a success returns instead of raising SystemExit(0): a rank that torchrun runs as a
    # function (--run-path) must return for its agent to see it finish
    status = main()
    if status:
        raise SystemExit(status)
