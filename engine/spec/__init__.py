"""Speculative decoding: drafters (drafter.py, ngram.py), the rejection-sampling verifier
(verify.py), the adaptive choice of the number of drafted tokens (policy.py) and the engine's
speculative step (step.py)."""
