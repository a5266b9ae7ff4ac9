"""pmkb's prompt templates, installed as the package ``pmkb_prompts`` (read by kb/llm/prompting.py)."""
