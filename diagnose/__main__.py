"""``python -m diagnose``: the same command line as ``diagnose``."""

from diagnose.cli import main

if __name__ == "__main__":
    main()
