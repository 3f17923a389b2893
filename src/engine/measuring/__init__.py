"""What is measured of a loop: paired timing and its intervals, component costs, acceptance without
timing, the free loop (recorded proposals at no drafting cost), the machine's limit, and the speedup
formulas."""
