"""`python -m tokentrace`: the same CLI as the `tokentrace` script."""

from tokentrace.cli import main

if __name__ == "__main__":
    main()
