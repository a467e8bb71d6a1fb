"""Reports: results records -> markdown tables and PNG plots. Reads only the results format."""
