"""Loss terms: small pure functions on tensors and masks.

Conventions shared by every function here:
- student tensors come first, teacher tensors second;
- a mask is a bool tensor, True where a position counts (padding is False);
- a loss returns a scalar averaged over the positions that count, so its size does not depend on
  batch shape or padding.
"""
