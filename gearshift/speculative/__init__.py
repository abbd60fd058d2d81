"""Speculative decoding: proposers (EAGLE-3 head, draft model, n-gram), draft trees,
lossless verification, and SpecRunner, the VERIFY step's stages (draft -> target ->
verify) and the draft's state between steps. The plain-decode path never imports this
package."""
