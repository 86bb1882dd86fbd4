"""The analysis side: trace and run record in, report out. Nothing here imports torch."""
