"""Secure aggregation (SecAgg+): the coordinator learns only the sum of a round's updates."""
