"""The torch side: runs the script in-process, drives the profiler, hooks, lines and knobs."""
