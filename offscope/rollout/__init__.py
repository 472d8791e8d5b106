"""Rollout tools: the regression gate (gate), deny-to-case mining (mine) and
shadow-vs-eval comparison (shadow). They read grid results and production
traces; they sit above evalmode and below the command line."""
