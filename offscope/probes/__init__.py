"""Boundary probes: the static census of agent definition files (census,
census_validation), live probes through an embedded proxy (probe, probe_bank,
probe_report), the simulated probe responder (simprobe) and offline rescoring
(rescore). The hand labels the census is validated against are in data/."""
