"""Ticket systems: GitHub and Jira REST calls, the durable event queue and its worker, and the
write-back of a suggestion as labels and one comment."""
