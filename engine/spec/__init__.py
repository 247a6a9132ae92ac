"""Speculative decoding: drafters (drafter.py, ngram.py), the rejection-sampling verifier
(verify.py) and the adaptive choice of the number of drafted tokens (policy.py)."""
