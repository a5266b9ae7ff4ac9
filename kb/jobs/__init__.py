"""Work over many tickets or the whole knowledge base: annotation, the resumable backfill and its
report, evaluation, feedback, the dashboard's data."""
