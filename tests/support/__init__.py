"""Shared test helpers: real loopback servers, proxies, trace builders and reference code."""
