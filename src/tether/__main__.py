"""`python -m tether`: the `tether` command."""

from tether.cli._app import main

if __name__ == "__main__":
    main()
