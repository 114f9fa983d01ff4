"""One module per CLI command (check, doctor, up/run, dashboard, bench, the equivalence check)."""
