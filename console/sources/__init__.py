"""Async adapters to the world outside: SSH, journal, GPU samplers, SGLang HTTP, the service, host-side files."""
