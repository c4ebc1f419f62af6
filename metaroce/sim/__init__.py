"""Deterministic simulation harness for the transport engine (virtual clock, seeded)."""
