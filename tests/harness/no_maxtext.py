"""Test-only plugin: makes `import maxtext` fail in the cell, as on a machine without it.

Loaded into a cell with `--plugin tests.harness.no_maxtext`; never part of the product.
"""

import sys

sys.modules["maxtext"] = None  # the import system raises ImportError for a None entry
