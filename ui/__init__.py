"""Rendering helpers and pages of the chat page (app.py); the domain lives in kb/."""
