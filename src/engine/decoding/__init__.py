"""The loops that generate text: plain and speculative sampling of a chain (decode), tree
verification (tree), B sequences at once (batch), and the draft-length policies (policy)."""
