"""The CLI (SSH command line) collector: see README.md here (sample configuration) and collector.py."""
