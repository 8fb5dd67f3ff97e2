"""Shared by every role: settings, the metadata DB and its models, Redis keys, exceptions, metrics, fault points."""
