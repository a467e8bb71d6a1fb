"""One subcommand of the `parity` command line (harness.cli), and the checks several share."""

from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: 'parity run: error: ... (see parity run --help)'."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Command:
    """One subcommand: `setup` adds its arguments, `run` handles it and returns the exit code."""

    name = ""
    help = ""
    description = ""

    @classmethod
    def setup(cls, parser: argparse.ArgumentParser) -> None:
        pass

    @classmethod
    def run(cls, args: argparse.Namespace) -> int:
        raise NotImplementedError


def check_fraction(threshold: float) -> None:
    """--threshold of ab and compare: the smallest relative timing difference that earns a
    verdict, a fraction in (0, 1)."""
    if not 0 < threshold < 1:
        raise ValueError(f"--threshold {threshold}: give a fraction, e.g. 0.05")
