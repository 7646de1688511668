"""``init()``: the mode, the run created or attached, its pipeline assembled."""
