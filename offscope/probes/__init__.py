"""Boundary probes: the static census of agent definition files (census,
census_validation, census_report), live probes through an embedded proxy (probe:
the run; probe_config, probe_bank, probe_plan, probe_calls, probe_stats,
live_histograms, probe_output, probe_report), the simulated probe responder
(simprobe) and offline rescoring (rescore). The hand labels the census is
validated against are in data/."""
