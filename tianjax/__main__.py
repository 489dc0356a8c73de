"""`python -m tianjax ...`: the `tianjax` command."""

import sys

from tianjax.cli import main

if __name__ == "__main__":  # importing the module (tools that import every module) runs nothing
    sys.exit(main())
