"""The Klein management app."""
