"""`python -m appliance` is the `appliance` command."""

import sys

from appliance.cli import main

sys.exit(main())
