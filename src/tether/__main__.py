"""`python -m tether`: the `tether` command. Unsafe in a directory the agent wrote (a tether/ package
there runs instead of this one); tether/__init__.py refuses what it can detect (tether._start)."""

from tether.cli._app import main

if __name__ == "__main__":
    main()
