"""The device runtime (docs/devices.md): the device secret and its privacy ledger, memoized
reports, the on-disk outbox and the sender that delivers it to the HTTP collector."""
