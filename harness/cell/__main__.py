"""`python -m harness.cell`: the cell worker (harness.cell.worker)."""

import sys

from harness.cell.worker import main

if __name__ == "__main__":
    sys.exit(main())
