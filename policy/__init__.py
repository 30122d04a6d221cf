"""PolicyService: rules engine, PII redaction, prompt-injection detection, streamed moderation, audit."""
