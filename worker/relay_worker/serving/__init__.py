"""Serving a model from a worker (or `relay serve`): the policy server."""
