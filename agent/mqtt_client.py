"""aiomqtt's client, with the one thing it does not do: read a PUBACK's reason code.

aiomqtt 2.5 resolves a QoS 1 publish on the broker's PUBACK whatever the PUBACK says, so an
MQTT 5 broker that refuses a message (0x87 Not authorized from an ACL, 0x97 Quota
exceeded, ...) looks like one that took it, and the outbox would delete an alert that never
arrived. `Client` records the reason code paho hands its on_publish callback, per message
id, and `publish` raises `BrokerRefused` when it is a failure (>= 0x80). The message id is
caught where paho assigns it (its `publish`, called synchronously inside aiomqtt's), through
a context variable, so concurrent publishes from several tasks each see their own. MQTT
3.1.1 has no reason code in a PUBACK: a 3.1.1 broker that drops a message on an ACL cannot
be told from one that took it (docs/mqtt.md).
"""

from __future__ import annotations

import contextvars
from typing import Any

import aiomqtt
from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["BrokerRefused", "Client"]

_MIDS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("mqtt_mids", default=None)


class BrokerRefused(aiomqtt.MqttError):
    """The broker answered a publish with a failure reason code (MQTT 5)."""

    def __init__(self, topic: str, reason: ReasonCode) -> None:
        self.topic = topic
        self.reason_code = int(reason.value)
        self.reason = str(reason)
        super().__init__(f"publish to {topic} refused: 0x{self.reason_code:02x} {self.reason}")


class Client(aiomqtt.Client):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refusals: dict[int, ReasonCode] = {}
        paho = self._client
        assign = paho.publish
        refusals = self._refusals

        def publish(*a: Any, **kw: Any) -> Any:
            info = assign(*a, **kw)
            refusals.pop(int(info.mid), None)  # a late answer to an earlier use of this id
            mids = _MIDS.get()
            if mids is not None:
                mids.append(int(info.mid))
            return info

        paho.publish = publish  # type: ignore[method-assign]

    def _on_publish(
        self, client: Any, userdata: Any, mid: int, reason_code: ReasonCode, properties: Any
    ) -> None:
        if getattr(reason_code, "is_failure", False):
            self._refusals[mid] = reason_code
        super()._on_publish(client, userdata, mid, reason_code, properties)

    async def publish(
        self,
        /,
        topic: str,
        payload: Any = None,
        qos: int = 0,
        retain: bool = False,
        properties: Any = None,
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        """aiomqtt's publish; raises BrokerRefused on a failure reason code."""
        mids: list[int] = []
        token = _MIDS.set(mids)
        try:
            await super().publish(
                topic, payload, qos, retain, properties, *args, timeout=timeout, **kwargs
            )
        finally:
            _MIDS.reset(token)
            refused = [self._refusals.pop(mid) for mid in mids if mid in self._refusals]
        if refused:
            raise BrokerRefused(topic, refused[0])
