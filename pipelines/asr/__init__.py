"""Audio in: microphone clips over MQTT, transcribed by faster-whisper into transcript
segments that take exactly the path published transcripts take.

Modules, one concern each: `settings` (the `asr:` config), `models` (Whisper models shipped
in PyPI packages, assembled once, never downloaded), `decode` (bytes of any container to
16 kHz mono, with the reasons a payload is refused), `buffer` (the per-stream and total
bound in seconds of audio, shedding the oldest), `prompt` (fault words for the decoder),
`stage` (the worker that owns the model). Nothing here imports faster-whisper at import
time: the service runs (keyword tier on published transcripts) without it.
"""
