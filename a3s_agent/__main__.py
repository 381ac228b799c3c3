"""`python -m a3s_agent` is the `a3s-agent` command."""

import sys

from .cli import main

sys.exit(main())
