"""`parity publish`: the nightly history as a static dashboard (index, a page per cell, a
page per shape), readable from file:// with no network. `history` judges every run as the
nightly did, `charts` and `pages` lay it out, `assets` holds what every page loads, and
`writer` writes the site whole or not at all."""

from reports.site.writer import Published, check_output, publish

__all__ = ["Published", "check_output", "publish"]
