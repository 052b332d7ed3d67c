"""The fusedops operator report (run ``python bench/report.py --help``)."""
