"""The conversation, transport-neutral: commands, authorisation, messages as data, rendering, the
experiment runner.
"""
