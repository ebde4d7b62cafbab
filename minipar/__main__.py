"""`python -m minipar ...` is the `minipar` command."""

import sys

from minipar.cli import main

sys.exit(main())
