"""Shells around the kb core: the command line and the webhook service."""
