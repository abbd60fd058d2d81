"""Speculative decoding: proposers (EAGLE-3 head, draft model, n-gram), draft trees,
lossless verification, and the worker that runs draft -> verify -> draft-extend.
The plain-decode path never imports this package."""
