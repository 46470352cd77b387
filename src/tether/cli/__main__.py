"""`python -m tether.cli`: the `tether` command without an installed script, and what the installed
launcher (launcher/tether) runs, as `python -P -m tether.cli` with only absolute PYTHONPATH entries."""

from tether.cli._app import main

if __name__ == "__main__":
    main()
