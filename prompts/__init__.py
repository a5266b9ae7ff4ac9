"""pmkb's prompt templates, installed as the package ``pmkb_prompts`` (read by kb/prompting.py)."""
