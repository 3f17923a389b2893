"""specsweep: measure when speculative decoding pays, honestly."""
