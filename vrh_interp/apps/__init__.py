"""Applications: the `vrh` command line, the demo, reproduce and the HTML report."""
