"""Tenants, tokens and principals, per-tenant limits, and the one rule for names."""
