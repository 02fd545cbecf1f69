"""Judging: verdicts with their noise model, thresholds, the rules, candidates, diffs."""
