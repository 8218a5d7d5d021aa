"""What every family of harness.ops shares: argument checks and the denominator floor (guards),
autocast at the chunk Functions' entry (precision), chunking of the time axis, the recurrent
forms' loop (scan), prefix sums and the chunk-to-chunk state scan (prefix), and log-decay sums
over segments (segments)."""
