"""Logical plans: what the query asks, before any decision on how to run it."""
