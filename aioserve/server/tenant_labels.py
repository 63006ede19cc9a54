"""The one rule for tenant label values in ``/metrics``: bounded, and pseudonymous when open.

Every series keyed by tenant (the tenant metrics, a policy's ``report()`` values per tenant)
takes its label from the server's one :class:`TenantLabels`, so a tenant carries the same
label everywhere and the number of label values stays bounded.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

OTHER = "other"
NONE = "none"
DEFAULT_MAX_TENANTS = 20


class BoundedLabels:
    """Label values of one kind: the first ``max_values`` distinct ones, then ``other``."""

    def __init__(self, max_values: int) -> None:
        self.max_values = max_values
        self.seen: set[str] = set()

    def __call__(self, value: object) -> str:
        label = NONE if value is None else str(value)
        if label in self.seen:
            return label
        if len(self.seen) >= self.max_values:
            return OTHER
        self.seen.add(label)
        return label


class TenantLabels:
    """Tenant label values: at most ``max_tenants`` distinct ones plus ``other``.

    With ``pseudonymous`` (``/metrics`` open to anyone, ``--metrics-public``), a tenant's
    label is ``t-`` and the first 12 hex digits of HMAC-SHA256 under ``secret`` (random per
    server start unless given), so a scrape never shows a raw ``user`` value; without it
    (``/metrics`` behind the API key) the raw value is the label. ``None`` is ``none``.
    """

    def __init__(self, max_tenants: int = DEFAULT_MAX_TENANTS, pseudonymous: bool = False,
                 secret: bytes | None = None) -> None:
        self.pseudonymous = pseudonymous
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self._bounded = BoundedLabels(max_tenants)

    def __call__(self, tenant: str | None) -> str:
        if tenant is None:
            return NONE
        if self.pseudonymous:
            digest = hmac.new(self._secret, tenant.encode(), hashlib.sha256).hexdigest()
            tenant = "t-" + digest[:12]
        return self._bounded(tenant)
