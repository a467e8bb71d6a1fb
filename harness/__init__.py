"""The harness: runner, measurement, trace capture/parse, results store, CLI."""
