"""`python -m tianjax ...`: the `tianjax` command."""

import sys

from tianjax.cli import main

sys.exit(main())
