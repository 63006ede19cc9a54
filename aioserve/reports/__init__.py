"""Reports: one outcome record, and on it percentiles, the SLO rule, goodput, tables, plots."""
