"""Reports: tables, plots and the HTML report."""
