"""`python -m tether.cli`: the `tether` command without an installed script."""

from tether.cli._app import main

if __name__ == "__main__":
    main()
