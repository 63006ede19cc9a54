"""What the scheduler lab reports of its runs (figures, tables, plots, HTML); it runs nothing."""
