"""`python -m attnres_ge.bench ...`: the same as `attnres-ge bench ...`."""

import sys

from attnres_ge.bench.run import main

sys.exit(main())
