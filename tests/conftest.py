"""Shared test configuration. Each area (engine, service, sdk) has its own fixtures beside its tests."""
