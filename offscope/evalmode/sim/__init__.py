"""The simulated model (simmodel), its reply classifier (simintent) and its dispositions."""
