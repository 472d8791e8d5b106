"""Rollout tools: the regression gate (gate), deny-to-case mining (mine),
shadow-vs-eval comparison (shadow) and replay of recorded traffic under a
candidate ledger or policy (replay). They read grid results and production
traces; they sit above evalmode and below the command line."""
