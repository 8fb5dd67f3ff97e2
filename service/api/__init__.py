"""The api role: HTTP in, requests into Redis, answers on commit (wait=true), the console and /metrics."""
