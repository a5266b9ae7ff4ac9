"""The vocabulary every layer shares: incidents and tickets, the taxonomy, settings, the
Suggestion type, the roles as Protocols, and how untrusted text is redacted and defused."""
