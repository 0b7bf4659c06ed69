"""`python -m api.cli serve ...`: the `structserve` console script."""

import sys

from api.cli.serve import main

sys.exit(main())
