"""`python -m lab` is the same as the `fencelab` command."""

from lab.cli import main

if __name__ == "__main__":
    main()
