"""The Klein management app and its door onto the broker's Session (door.py)."""
