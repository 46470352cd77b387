"""`python -m tether`: the `tether` command."""

from tether.cli.app import main

if __name__ == "__main__":
    main()
