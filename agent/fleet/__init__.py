"""Fleet configuration over MQTT: signed, versioned documents per target (a group of
devices or one device), verified, validated like a local file, applied with a health gate
and rolled back by themselves (docs/fleet.md).

Modules: `document` (the signed document, Ed25519 keys, canonical bytes), `layers` (reset
pointers, patch merge, what may be set remotely and what a change restarts), `store` (the
applied and pending state, written atomically), `manager` (verify, validate, stage, apply,
gate, acknowledge). Imports nothing at package import time.
"""
