"""`python -m tokentrace`: the same CLI as the `tokentrace` script."""

from tokentrace.cli import run

if __name__ == "__main__":
    run()
