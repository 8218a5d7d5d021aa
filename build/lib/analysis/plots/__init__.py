"""One module per figure family; each figure function takes results and returns a Figure."""
