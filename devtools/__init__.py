"""Tools for running the system locally: tests, benchmarks and the demo share them."""
