"""What the processes of one run share at run time: the run directory (endpoints, done markers,
progress), the run's secret, worker and request ids, and the addresses and ports workers bind."""
